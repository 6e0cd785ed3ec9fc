/**
 * The ground the llama.cpp engines stand on: the generated tiny model loads in llama.cpp (the real
 * runtime, CPU build), and a sequence's KV state saved after the prompt in one context and loaded
 * in another — as bytes, the way they will cross the transfer core — continues token for token
 * as the same prompt does in a single context.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { getLlama, type Llama, LlamaLogLevel, type LlamaModel, type Token } from 'node-llama-cpp';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { tinyModelGguf, writeTinyModel } from '../tiny-gguf.ts';

let llama: Llama;
let model: LlamaModel;
let dir: string;

beforeAll(async () => {
  dir = tempDir('pdctl-llama-');
  writeTinyModel(join(dir, 'tiny.gguf'));
  llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
  model = await llama.loadModel({ modelPath: join(dir, 'tiny.gguf') });
}, 60_000);
afterAll(async () => {
  await model?.dispose();
  await llama?.dispose();
});

async function greedy(tokens: Token[], n: number, seq: Awaited<ReturnType<typeof sequence>>) {
  const out: Token[] = [];
  for await (const t of seq.evaluate(tokens, { temperature: 0 })) {
    out.push(t);
    if (out.length >= n) break;
  }
  return out;
}

async function sequence(contextSize = 512) {
  // One thread: llama.cpp's threads spin while they wait, and on a busy 2-core machine more than
  // one makes every step wait for a core (3.7 s instead of 35 ms for 8 tokens here).
  const ctx = await model.createContext({ contextSize, sequences: 1, threads: 1 });
  return Object.assign(ctx.getSequence(), { ctx });
}

describe('the tiny model in llama.cpp', () => {
  it('is the same file for the same seed, another for another seed, and under 1 MB', () => {
    const a = tinyModelGguf({ seed: 7 });
    expect(a.equals(tinyModelGguf({ seed: 7 }))).toBe(true);
    expect(a.equals(tinyModelGguf({ seed: 8 }))).toBe(false);
    expect(a.length).toBeLessThan(1 << 20);
    expect(a.subarray(0, 4).toString('ascii')).toBe('GGUF');
  });

  it('tokenizes words as words, anything else as bytes, and round-trips text', () => {
    const words = model.tokenize('the quiet harbor');
    expect(words.length).toBe(3);
    expect(model.detokenize(words)).toBe('the quiet harbor');
    const other = model.tokenize('zürich');
    expect(model.detokenize(other)).toBe('zürich');
  });

  it('a prompt prefilled in one context and decoded in another from its saved state gives the same tokens', async () => {
    const prompts = [
      'the quiet harbor keeps its lanterns lit',
      'a river of stone',
      'winter',
      'the village market opens at morning, and the bridge waits',
    ];
    for (const [i, text] of prompts.entries()) {
      const prompt = model.tokenize(text, false);
      const tokens = [model.tokens.bos as Token, ...prompt];
      const one = await sequence();
      const reference = await greedy(tokens, 24, one);
      await one.ctx.dispose();

      const prefill = await sequence();
      await prefill.evaluateWithoutGeneratingNewTokens(tokens.slice(0, -1));
      const file = join(dir, `state-${i}.bin`);
      await prefill.saveStateToFile(file);
      await prefill.ctx.dispose();
      // The state as bytes: what the prefill engine writes into its pages and the decode engine
      // reads from its own.
      const bytes = readFileSync(file);
      const arrived = join(dir, `arrived-${i}.bin`);
      writeFileSync(arrived, Buffer.from(bytes));

      const decode = await sequence();
      await decode.loadStateFromFile(arrived, { acceptRisk: true });
      const continued = await greedy(tokens.slice(-1), 24, decode);
      await decode.ctx.dispose();
      expect(continued, text).toEqual(reference);
      expect(model.detokenize(continued).length).toBeGreaterThan(0);
    }
  });
});
