/**
 * A llama.cpp prefill engine's prefix reuse, on the real runtime: a prefill continues a sequence
 * only from a held prefix of at least a block, and otherwise starts on an empty sequence
 * (bench:model --concurrency 8 found prefills continuing from a lone held BOS token, three times
 * slower under llama.cpp's CPU flash attention); a miss overwrites the sequence given back longest ago, not the one holding a prompt;
 * and `auto` measures whether continuing pays before turning reuse on.
 */
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { llamaPrompt } from '../../../test/helpers/llama.ts';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { writeTinyModel } from '../tiny-gguf.ts';
import { LlamaEngineModel } from './engine-model.ts';
import { LlamaModelInfo } from './model-info.ts';

const BLOCK = 64;
let path: string;
let info: LlamaModelInfo;
const opened: LlamaEngineModel[] = [];

async function open(prefixReuse: 'auto' | 'on' | 'off'): Promise<LlamaEngineModel> {
  const m = await LlamaEngineModel.open({
    modelPath: path,
    sequences: 4,
    contextSize: 1024,
    gpu: 'cpu',
    threads: 1,
    prefixReuse,
    minReuseTokens: BLOCK,
  });
  opened.push(m);
  return m;
}

/**
 * The page a prefill of `prompt` writes its KV image into, the positions it reused, and the first
 * token it drew (greedy).
 */
async function prefill(m: LlamaEngineModel, prompt: string) {
  const page = new Uint8Array(4 << 20);
  const r = await m.prefill(info.tokenize(prompt), [page], async () => true);
  if (!r?.first) throw new Error('the prefill stopped, or drew no first token');
  // The state's save is a part of the prefill's time, reported apart (bench:model splits on it).
  expect(r.saveMicros).toBeGreaterThan(0);
  expect(r.saveMicros).toBeLessThanOrEqual(r.micros);
  return { reused: r.reused ?? 0, page, first: r.first };
}

/** 12 greedy tokens: the prefill's first, then those decoded on `m` from the KV image it wrote. */
async function greedy(
  m: LlamaEngineModel,
  prompt: string,
  { page, first }: Awaited<ReturnType<typeof prefill>>,
): Promise<number[]> {
  const stream = await m.startDecode(info.tokenize(prompt), first, [page], { temperature: 0 });
  const ids: number[] = [first.token];
  try {
    for (
      let step = await stream.next();
      step !== null && ids.length < 12;
      step = await stream.next()
    )
      ids.push(step.token);
  } finally {
    stream.close();
  }
  return ids;
}

beforeAll(async () => {
  path = join(tempDir('pdctl-llama-reuse-'), 'tiny.gguf');
  writeTinyModel(path);
  info = await LlamaModelInfo.open({
    modelPath: path,
    sequences: 4,
    contextSize: 1024,
    gpu: 'cpu',
  });
}, 60_000);
afterAll(async () => {
  for (const m of opened) await m.close();
  await info?.close();
});

describe('llama.cpp prefix reuse in a prefill engine', () => {
  it('starts a prompt that shares less than a block with every held one on an empty sequence, leaving the held prompt alone', async () => {
    const on = await open('on');
    const off = await open('off');
    const a = llamaPrompt(3, 300);
    const b = llamaPrompt(5, 300);
    const heldA = info.tokenize(a);
    expect(info.tokenize(a)[0]).toBe(info.tokenize(b)[0]);
    expect((await prefill(on, a)).reused).toBe(0);
    // Both start with the same token; before, the prefill continued from it (reused 1).
    const warm = await prefill(on, b);
    expect(warm.reused).toBe(0);
    const ref = await off.generate(info.tokenize(b), 12);
    expect(await greedy(off, b, warm)).toEqual(ref.tokens);
    // The miss took an empty sequence: the prompt held before is still there to continue from.
    expect(on.heldPrefixes?.().some((t) => t.join() === heldA.join())).toBe(true);
    expect(off.heldPrefixes).toBeUndefined();
  });

  it('continues a prompt from the held prefix it starts with, and decodes as the cold run does', async () => {
    const on = await open('on');
    const off = await open('off');
    const base = llamaPrompt(7, 300);
    const longer = `${base} ${llamaPrompt(9, 40)}`;
    await prefill(on, base);
    const warm = await prefill(on, longer);
    // What the held prompt shares with the longer one, every token of it (the prefill kept the
    // whole prompt: its last token was evaluated to draw the first).
    const held = info.tokenize(base);
    const tokens = info.tokenize(longer);
    let shared = 0;
    while (shared < held.length && held[shared] === tokens[shared]) shared++;
    expect(shared).toBeGreaterThanOrEqual(held.length - 1);
    expect(warm.reused).toBe(Math.min(shared, tokens.length - 1));
    expect(warm.reused).toBeGreaterThanOrEqual(BLOCK);
    expect(await greedy(off, longer, warm)).toEqual((await off.generate(tokens, 12)).tokens);
  });

  it('auto measures continuing against computing again, and keeps prompts only where continuing pays', async () => {
    const auto = await open('auto');
    const c = auto.continuation;
    if (!c) throw new Error('auto measured nothing');
    expect(c.coldMs).toBeGreaterThan(0);
    expect(c.continueMs).toBeGreaterThan(0);
    expect(c.pays).toBe(c.continueMs < c.coldMs / 2);
    expect(auto.heldPrefixes !== undefined).toBe(c.pays);
    expect((await open('on')).continuation).toBeNull();
  });
});
