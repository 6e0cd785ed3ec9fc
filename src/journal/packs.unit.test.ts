import { describe, expect, it } from 'vitest';
import { sharedSuffix } from './packs.ts';

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
