import { describe, expect, it } from 'vitest';
import { positionSeed, sampleOptions } from './engine-model.ts';

describe('sampling options for llama.cpp', () => {
  it("applies OpenAI's defaults, not node-llama-cpp's (top_p 1, no top_k), and no repeat penalty unless asked", () => {
    const o = sampleOptions({ temperature: 1, seed: 5 }, [1, 2, 3]);
    expect(o).toMatchObject({ temperature: 1, topP: 1, topK: 0 });
    expect(o.repeatPenalty).toBeUndefined();
    expect(sampleOptions({ temperature: 1, topP: 0.9, topK: 40 }, [])).toMatchObject({
      topP: 0.9,
      topK: 40,
    });
  });

  it('seeds each position of a request differently, and the same position the same way', () => {
    const seeds = Array.from({ length: 1000 }, (_, p) => positionSeed(42, p));
    expect(new Set(seeds).size).toBe(1000);
    expect(seeds.every((s) => Number.isInteger(s) && s >= 0 && s < 2 ** 31)).toBe(true);
    expect(positionSeed(42, 17)).toBe(seeds[17]);
    expect(positionSeed(43, 17)).not.toBe(seeds[17]);
    // The seed of the token drawn next is the context length's: a migrated room that continues
    // with the same context draws with the same seed.
    expect(sampleOptions({ temperature: 1, seed: 42 }, [9, 9, 9]).seed).toBe(positionSeed(42, 3));
  });

  it('penalizes the last 64 tokens of the context, with the frequency and presence asked for', () => {
    const context = Array.from({ length: 100 }, (_, i) => i);
    const o = sampleOptions(
      { temperature: 1, frequencyPenalty: 0.5, presencePenalty: -1 },
      context,
    );
    expect(o.repeatPenalty).toMatchObject({
      punishTokens: context.slice(-64),
      penalty: 1,
      frequencyPenalty: 0.5,
      presencePenalty: -1,
    });
  });
});
