/**
 * OpenAI's frequency and presence penalties on the real runtime: they lower the logits before any
 * choice, so they change greedy text too (temperature 0 once went through a single evaluation that
 * never saw them), and a decode from a KV image draws what one process does.
 */
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { llamaPrompt } from '../../../test/helpers/llama.ts';
import { tempDir } from '../../../test/helpers/tmp.ts';
import type { Sampling } from '../executor.ts';
import { writeTinyModel } from '../tiny-gguf.ts';
import { greedyUnpenalized, LlamaEngineModel } from './engine-model.ts';
import { LlamaModelInfo } from './model-info.ts';

let m: LlamaEngineModel;
let info: LlamaModelInfo;

beforeAll(async () => {
  const path = join(tempDir('pdctl-llama-penalties-'), 'tiny.gguf');
  writeTinyModel(path);
  m = await LlamaEngineModel.open({
    modelPath: path,
    sequences: 2,
    contextSize: 512,
    gpu: 'cpu',
    threads: 1,
    prefixReuse: 'off',
  });
  info = await LlamaModelInfo.open({ modelPath: path, sequences: 2, contextSize: 512, gpu: 'cpu' });
}, 60_000);
afterAll(async () => {
  await m?.close();
  await info?.close();
});

/** 40 tokens: the prefill's first, then those decoded from the KV image it wrote (the engines' path). */
async function decoded(tokens: number[], sampling: Sampling): Promise<number[]> {
  const page = new Uint8Array(4 << 20);
  const done = await m.prefill(tokens, [page], async () => true, { sampling });
  if (!done?.first) throw new Error('prefill stopped, or drew no first token');
  const stream = await m.startDecode(tokens, done.first, [page], sampling);
  const ids: number[] = [done.first.token];
  try {
    for (let s = await stream.next(); s !== null && ids.length < 40; s = await stream.next())
      ids.push(s.token);
  } finally {
    stream.close();
  }
  return ids;
}

describe('penalties at temperature 0 on llama.cpp', () => {
  it('change greedy text, the same way in one process and through a KV image', async () => {
    const tokens = info.tokenize(llamaPrompt(11, 30));
    const plain = (await m.generate(tokens, 40, { temperature: 0 })).tokens;
    const repeats = plain.length - new Set(plain).size;
    expect(repeats, 'the tiny model repeats itself greedily').toBeGreaterThan(0);
    for (const penalty of [
      { frequencyPenalty: 2 },
      { presencePenalty: 2 },
      { frequencyPenalty: 1, presencePenalty: 1 },
    ]) {
      const sampling = { temperature: 0, ...penalty };
      expect(greedyUnpenalized(sampling)).toBe(false);
      const penalized = (await m.generate(tokens, 40, sampling)).tokens;
      expect(penalized, JSON.stringify(penalty)).not.toEqual(plain);
      expect(await decoded(tokens, sampling), JSON.stringify(penalty)).toEqual(penalized);
    }
    expect(greedyUnpenalized({ temperature: 0, frequencyPenalty: 0 })).toBe(true);
  });
});
