import { describe, expect, it } from 'vitest';
import { PACK_AFTER_MS } from '../journal/packs.ts';
import { PACK_MIN_RETAIN_MS, packAfterFor } from './stack.ts';

describe('packing under retention', () => {
  it('packs rooms 5 minutes after they end when the journal keeps everything', () => {
    expect(packAfterFor(undefined)).toBe(PACK_AFTER_MS);
  });

  it('does not pack under a horizon that would prune rooms soon after they were packed', () => {
    expect(packAfterFor({ roomsMs: 5 * 60_000 })).toBeUndefined();
    expect(packAfterFor({ roomsMs: PACK_MIN_RETAIN_MS - 1 })).toBeUndefined();
  });

  it('packs under a horizon at least three times the packing delay', () => {
    expect(PACK_MIN_RETAIN_MS).toBe(3 * PACK_AFTER_MS);
    expect(packAfterFor({ roomsMs: PACK_MIN_RETAIN_MS })).toBe(PACK_AFTER_MS);
    expect(packAfterFor({ roomsMs: 7 * 24 * 3_600_000 })).toBe(PACK_AFTER_MS);
  });
});
