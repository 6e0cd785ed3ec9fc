import { describe, expect, it } from 'vitest';
import { VirtualClock } from '../sim/world/clock.ts';
import { seededIds, systemIds } from './ids.ts';
import { seeded } from './random.ts';

describe('ids', () => {
  it('are the same for the same clock and seed, and differ for another seed', () => {
    const run = (seed: number) => {
      const clock = new VirtualClock(1_800_000_000_000);
      const ids = seededIds(clock, seeded(seed));
      const out = [ids.uuid(), ids.room()];
      clock.advance(3);
      out.push(ids.uuid(), ids.uuid(), ids.room());
      return out;
    };
    expect(run(5)).toEqual(run(5));
    expect(run(5)).not.toEqual(run(6));
    const [first, room] = run(5);
    expect(first).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(room).toMatch(/^r-[0-9a-z]+-000001$/);
  });

  it('grow with time and within one millisecond', () => {
    const a = systemIds.uuid(4_000_000_000_000);
    const b = systemIds.uuid(4_000_000_000_000);
    expect(b > a).toBe(true);
  });
});
