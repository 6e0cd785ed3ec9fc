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

  it(`never loses or duplicates a page under any sequence of reserves and releases (seed ${seed})`, () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.tuple(fc.boolean(), fc.integer({ min: 0, max: 9 }), fc.integer({ min: 1, max: 6 })),
          {
            maxLength: 200,
          },
        ),
        (ops) => {
          const a = new PageAllocator(16);
          for (const [reserve, room, n] of ops) {
            if (reserve && a.pagesOf(`r${room}`) === null) a.reserve(`r${room}`, n);
            else a.release(`r${room}`);
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
