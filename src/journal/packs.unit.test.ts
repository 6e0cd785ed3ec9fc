import { describe, expect, it } from 'vitest';
import { PACK_SPAN_SEQS, seqWindows, sharedSuffix, takeInto } from './packs.ts';

/** What the view gives back from a split: the head without its last `depth` characters, then the suffix. */
const joined = (s: { head: string; suffix: string; depth: number }) =>
  s.head.slice(0, -s.depth) + s.suffix;

describe('sharedSuffix', () => {
  const reservation = {
    decode: { pages: [3, 4], pool: '/pool-a', epoch: 77, incarnation: 'inc-1' },
  };
  const shared = { prefillEngine: 'p0', decodeEngine: 'd0', deadlinesMs: { created: 2000 } };

  it('splits inside the reservation when everything after its pool is shared', () => {
    const text = JSON.stringify({ promptTokens: 40, reservation, ...shared });
    const s = sharedSuffix('room.created', text);
    expect(s).toEqual({
      head: '{"promptTokens":40,"reservation":{"decode":{"pages":[3,4]}}}',
      suffix: text.slice(text.indexOf(',"pool":')),
      depth: 3,
    });
    expect(joined(s as NonNullable<typeof s>)).toBe(text);
  });

  it('splits at the top where a key that is not shared follows the reservation', () => {
    const text = JSON.stringify({ reservation, requestId: 'r-1', ...shared });
    const s = sharedSuffix('room.created', text);
    expect(s?.depth).toBe(1);
    expect(s?.suffix.startsWith(',"prefillEngine":')).toBe(true);
    expect(joined(s as NonNullable<typeof s>)).toBe(text);
  });

  it('keeps the data whole where shared keys are not last, nothing would be left, or the text is not as JSON.stringify writes it', () => {
    expect(sharedSuffix('room.created', JSON.stringify({ ...shared, promptTokens: 1 }))).toBeNull();
    expect(sharedSuffix('room.bootstrapped', JSON.stringify({ pool: 'a', epoch: 1 }))).toBeNull();
    expect(sharedSuffix('room.bootstrapped', '{"pages": [1], "pool": "a"}')).toBeNull();
    expect(sharedSuffix('room.released', JSON.stringify({ pages: 1 }))).toBeNull();
    expect(sharedSuffix('room.completed', 'not json')).toBeNull();
  });
});

describe('the windows of seqs a read walks', () => {
  it('covers floor to head without gaps, each twice as wide as the last up to a pack span', () => {
    const up = [...seqWindows(10, 100, 8, false)];
    expect(up).toEqual([
      { lo: 10, hi: 18 },
      { lo: 18, hi: 34 },
      { lo: 34, hi: 66 },
      { lo: 66, hi: 100 },
    ]);
    const down = [...seqWindows(10, 100, 8, true)];
    expect(down).toEqual([
      { lo: 92, hi: 100 },
      { lo: 76, hi: 92 },
      { lo: 44, hi: 76 },
      { lo: 10, hi: 44 },
    ]);
    expect([...seqWindows(5, 5, 8, false)]).toEqual([]);
    const wide = [...seqWindows(0, 10 * PACK_SPAN_SEQS, PACK_SPAN_SEQS / 2, false)];
    expect(Math.max(...wide.map((w) => w.hi - w.lo))).toBe(PACK_SPAN_SEQS);
  });

  it('takes the first of a window, or the last before what it found, up to the limit', () => {
    const found = [1, 2];
    expect(takeInto(found, [3, 4, 5], 4, false)).toBe(true);
    expect(found).toEqual([1, 2, 3, 4]);
    const newest = [8, 9];
    expect(takeInto(newest, [5, 6, 7], 4, true)).toBe(true);
    expect(newest).toEqual([6, 7, 8, 9]);
    const few = [9];
    expect(takeInto(few, [7, 8], 5, true)).toBe(false);
    expect(few).toEqual([7, 8, 9]);
  });
});
