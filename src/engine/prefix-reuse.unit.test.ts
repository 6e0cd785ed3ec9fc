import { describe, expect, it } from 'vitest';
import type { EngineModel } from '../model/executor.ts';
import { blockNames } from '../model/prefix-blocks.ts';
import type { KvPool } from '../transfer/pool.ts';
import { PageAllocator } from './allocator.ts';
import { PrefixReuse } from './prefix-reuse.ts';

/** A model runtime that keeps prefixes itself (as llama.cpp's sequences do): what it holds is set by the test. */
function runtime(held: number[][]): EngineModel {
  return { slots: 2, contextSize: 256, heldPrefixes: () => held } as unknown as EngineModel;
}

const tokens = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
const reuse = (model: EngineModel, budgetPages: number) =>
  PrefixReuse.for({
    model,
    pool: {} as KvPool,
    allocator: new PageAllocator(8),
    blockTokens: 4,
    budgetPages,
    pagesPerBlock: 1,
  });

describe('prefix reuse kept by the model runtime', () => {
  it('reports the room’s blocks the runtime holds once, and those it let go', () => {
    const held: number[][] = [];
    const r = reuse(runtime(held), 8) as PrefixReuse;
    expect(r.announce()).toEqual({ blockTokens: 4, capacityBlocks: 128, blocks: 0 });
    const a = tokens(0, 10);
    const names = blockNames(a, 4);
    held.push(a.slice(0, -1)); // the sequence keeps the prompt but its last token
    expect(r.finish(names, [], { pages: [], store: () => {} }, 0)).toEqual({
      reusedBlocks: 0,
      storedBlocks: names,
    });
    // The same prompt again, its 8 positions reused: nothing new to report.
    expect(r.finish(names, [], { pages: [], store: () => {} }, 8)).toEqual({ reusedBlocks: 2 });
    // The sequence now serves another prompt: the first one's blocks are gone.
    held[0] = tokens(100, 9);
    const other = blockNames(tokens(100, 10), 4);
    expect(r.finish(other, [], { pages: [], store: () => {} }, 0)).toEqual({
      reusedBlocks: 0,
      storedBlocks: other,
      evictedBlocks: names,
    });
  });

  it('is off with a budget of 0 (--prefix-cache-pages 0), and for a model that keeps nothing', () => {
    expect(reuse(runtime([]), 0)).toBeNull();
    expect(reuse({ slots: 1, contextSize: 64 } as unknown as EngineModel, 8)).toBeNull();
  });
});
