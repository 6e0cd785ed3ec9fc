import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { blockNames, sharedBlocks } from './prefix-blocks.ts';

const tokens = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);

describe('blockNames', () => {
  it('names only full blocks, each a 32-hex-digit name', () => {
    const names = blockNames(tokens(10), 4);
    expect(names).toHaveLength(2);
    for (const n of names) expect(n).toMatch(/^[0-9a-f]{32}$/);
    expect(blockNames(tokens(3), 4)).toEqual([]);
  });

  it('a block names its whole prefix: equal tokens inside a block, different before it, differ', () => {
    const a = [1, 2, 3, 4, 5, 6, 7, 8];
    const b = [9, 2, 3, 4, 5, 6, 7, 8];
    const [a0, a1] = blockNames(a, 4);
    const [b0, b1] = blockNames(b, 4);
    expect(a0).not.toBe(b0);
    // The second blocks hold the same tokens, but follow different prefixes.
    expect(a1).not.toBe(b1);
  });

  it('two prompts share exactly the blocks before the first token where they differ', () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 50_000 }), { minLength: 0, maxLength: 200 }),
        fc.nat(),
        fc.integer({ min: 1, max: 16 }),
        (prompt, cut, blockTokens) => {
          const at = prompt.length === 0 ? 0 : cut % prompt.length;
          const other = [...prompt];
          if (other.length > 0) other[at] = (other[at] as number) + 1;
          const shared = sharedBlocks(
            blockNames(prompt, blockTokens),
            blockNames(other, blockTokens),
          );
          const expected =
            prompt.length === 0
              ? 0
              : Math.min(Math.floor(at / blockTokens), Math.floor(prompt.length / blockTokens));
          expect(shared).toBe(expected);
          // A longer prompt with the same start keeps every full block of the shorter one.
          const longer = [...prompt, ...tokens(blockTokens)];
          const mine = blockNames(prompt, blockTokens);
          expect(blockNames(longer, blockTokens).slice(0, mine.length)).toEqual(mine);
        },
      ),
    );
  });

  it('refuses a block size or a token that is not one', () => {
    expect(() => blockNames(tokens(8), 0)).toThrow(/blockTokens must be a positive integer/);
    expect(() => blockNames([1, 2, -3, 4], 2)).toThrow(/token 2 is not a token id/);
    expect(() => blockNames([1, 2.5], 2)).toThrow(/token 1 is not a token id/);
  });
});
