import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { PageAllocator } from './allocator.ts';

const seed = Number(process.env.FC_SEED ?? Date.now() % 2 ** 31);

describe('page allocator', () => {
  it('reserves whole or nothing, and frees a room once', () => {
    const a = new PageAllocator(4);
    expect(a.reserve('r1', 3)).toEqual([0, 1, 2]);
    expect(a.reserve('r2', 2)).toBeNull();
    expect(a.free).toBe(1);
    expect(a.release('r1')).toBe(3);
    expect(a.release('r1')).toBe(0);
    expect(a.free).toBe(4);
  });

  it('claims the pages a reservation names, or says why not and holds nothing', () => {
    const a = new PageAllocator(8);
    expect(a.claim('r1', [5, 6])).toBeNull();
    expect(a.pagesOf('r1')).toEqual([5, 6]);
    expect(a.claim('r2', [4, 6])).toBe('page 6 is taken');
    expect(a.claim('r2', [7, 8])).toBe('page 8 is outside the pool (8 pages)');
    expect(a.claim('r2', [3, 3])).toBe('page 3 is named twice');
    expect(a.claim('r1', [0])).toBe('room r1 already holds pages');
    expect(a.pagesOf('r2')).toBeNull();
    expect(a.free).toBe(6);
    // Picking skips the claimed pages, lowest first.
    expect(a.reserve('r3', 6)).toEqual([0, 1, 2, 3, 4, 7]);
    expect(a.reserve('r4', 1)).toBeNull();
    expect(a.release('r1')).toBe(2);
    expect(a.reserve('r4', 2)).toEqual([5, 6]);
  });

  it(`never loses or duplicates a page under any sequence of reserves, claims and releases (seed ${seed})`, () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.tuple(
            fc.constantFrom('reserve', 'claim', 'release'),
            fc.integer({ min: 0, max: 9 }),
            fc.integer({ min: 1, max: 6 }),
            fc.array(fc.integer({ min: 0, max: 15 }), { minLength: 1, maxLength: 4 }),
          ),
          { maxLength: 200 },
        ),
        (ops) => {
          const a = new PageAllocator(16);
          for (const [op, room, n, named] of ops) {
            const id = `r${room}`;
            if (op === 'release' || a.pagesOf(id) !== null) a.release(id);
            else if (op === 'reserve') a.reserve(id, n);
            else {
              const held = new Set(a.rooms().flatMap((r) => a.pagesOf(r) ?? []));
              const free = new Set(named).size === named.length && named.every((p) => !held.has(p));
              expect(a.claim(id, named) === null).toBe(free);
            }
            const held = a.rooms().flatMap((r) => a.pagesOf(r) ?? []);
            expect(new Set(held).size).toBe(held.length);
            expect(held.length + a.free).toBe(16);
          }
        },
      ),
      { seed },
    );
  });
});
