import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PageAllocator } from './allocator.ts';
import { PrefixCache } from './prefix-cache.ts';

const seed = Number(process.env.FC_SEED ?? Date.now() % 2 ** 31);

function cache(pages = 16, budgetPages = 8, pagesPerBlock = 2) {
  const allocator = new PageAllocator(pages);
  return {
    allocator,
    cache: new PrefixCache(allocator, { blockTokens: 4, pagesPerBlock, budgetPages }),
  };
}

describe('prefix cache', () => {
  it('hits only leading blocks, and stores a prefix from its head within the budget', () => {
    const { allocator, cache: c } = cache();
    expect(c.capacityBlocks).toBe(4);
    expect(c.pin('r1', ['a', 'b'])).toEqual([]);
    c.unpin('r1');
    const { stored, evicted } = c.store(['a', 'b', 'c', 'd', 'e', 'f']);
    // The budget holds four blocks: the head of the prefix is kept, never a tail without it.
    expect(stored.map((s) => [s.name, s.index])).toEqual([
      ['a', 0],
      ['b', 1],
      ['c', 2],
      ['d', 3],
    ]);
    expect(evicted).toEqual([]);
    expect(allocator.free).toBe(8);
    expect(c.pin('r2', ['a', 'b', 'x', 'd'])).toHaveLength(2);
    c.unpin('r2');
    expect(c.pin('r3', ['x', 'a'])).toHaveLength(0);
    c.unpin('r3');
  });

  it('evicts the least recently used prefix first, tail before head, never a pinned block', () => {
    const { cache: c } = cache();
    c.store(['a1', 'a2']);
    c.store(['b1', 'b2']);
    // a was used last: b goes first, its tail first.
    c.pin('r', ['a1', 'a2']);
    c.unpin('r');
    const first = c.store(['c1']);
    expect(first.evicted).toEqual(['b2']);
    // A pinned prefix survives a store that needs its pages.
    c.pin('busy', ['a1', 'a2']);
    const second = c.store(['d1', 'd2']);
    expect(second.evicted).toEqual(['b1', 'c1']);
    expect(c.has('a1') && c.has('a2')).toBe(true);
    c.unpin('busy');
  });

  it('gives rooms the pages of unpinned blocks, and takes none when that would not be enough', () => {
    const { allocator, cache: c } = cache(8, 8);
    c.store(['a', 'b', 'c', 'd']);
    expect(allocator.free).toBe(0);
    expect(c.evictablePages).toBe(8);
    c.pin('r', ['a']);
    expect(c.evictFor(8)).toEqual([]); // a is pinned: 6 pages at most, nothing evicted
    expect(c.size).toBe(4);
    expect(c.evictFor(3).sort()).toEqual(['c', 'd']);
    expect(allocator.free).toBe(4);
    c.unpin('r');
  });

  it(`never loses a page, and holds at most its budget, under any mix of rooms and blocks (seed ${seed})`, () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.tuple(
            fc.constantFrom('store', 'pin', 'room', 'free'),
            fc.array(fc.integer({ min: 0, max: 5 }), { maxLength: 5 }),
            fc.integer({ min: 1, max: 9 }),
          ),
          { maxLength: 80 },
        ),
        (ops) => {
          const { allocator, cache: c } = cache(20, 10);
          let rooms = 0;
          for (const [op, ids, n] of ops) {
            const names = ids.map((i) => `b${i}`);
            if (op === 'store') c.store(names);
            else if (op === 'pin') {
              c.pin(`p${rooms}`, names);
              if (n % 2 === 0) c.unpin(`p${rooms}`);
              rooms++;
            } else if (op === 'room') {
              if (!allocator.reserve(`r${rooms}`, n)) {
                c.evictFor(n);
                allocator.reserve(`r${rooms}`, n);
              }
              rooms++;
            } else for (const r of allocator.rooms()) if (!r.startsWith('#')) allocator.release(r);
            const roomPages = allocator
              .rooms()
              .filter((r) => !r.startsWith('#'))
              .reduce((s, r) => s + (allocator.pagesOf(r)?.length ?? 0), 0);
            expect(roomPages + c.pages + allocator.free).toBe(20);
            expect(c.pages).toBeLessThanOrEqual(10);
          }
        },
      ),
      { seed },
    );
  });
});
