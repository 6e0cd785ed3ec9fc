import { describe, expect, it } from 'vitest';
import { seeded, systemRandom } from './random.ts';

const draws = (seed: number, n = 8) => {
  const r = seeded(seed);
  return Array.from({ length: n }, () => r.next());
};

describe('seeded random', () => {
  it('repeats exactly from a seed, and differs between seeds', () => {
    expect(draws(42)).toEqual(draws(42));
    expect(draws(42)).not.toEqual(draws(43));
    expect(draws(0)).not.toEqual(draws(1));
  });

  it('draws floats in [0, 1), spread evenly', () => {
    const r = seeded(7);
    const buckets = new Array(10).fill(0) as number[];
    let outside = 0;
    for (let i = 0; i < 100_000; i++) {
      const x = r.next();
      if (!(x >= 0 && x < 1)) outside++;
      else {
        const k = Math.floor(x * 10);
        buckets[k] = (buckets[k] as number) + 1;
      }
    }
    expect(outside).toBe(0);
    // Each tenth gets 10,000 ± 5 % (a fair generator misses that with vanishing odds).
    for (const b of buckets) expect(Math.abs(b - 10_000)).toBeLessThan(500);
  });

  it('gives integers in range, picks, chances, and refuses what makes no sense', () => {
    const r = seeded(3);
    const seen = new Set<number>();
    for (let i = 0; i < 1000; i++) {
      const k = r.between(-2, 2);
      expect(Number.isInteger(k) && k >= -2 && k <= 2).toBe(true);
      seen.add(k);
    }
    expect(seen).toEqual(new Set([-2, -1, 0, 1, 2]));
    expect(['x', 'y']).toContain(r.pick(['x', 'y']));
    expect(r.chance(0)).toBe(false);
    expect(r.chance(1)).toBe(true);
    expect(() => r.int(0)).toThrow(RangeError);
    expect(() => r.between(3, 2)).toThrow(RangeError);
    expect(() => r.pick([])).toThrow(RangeError);
    expect(() => seeded(1.5)).toThrow(RangeError);
  });

  it('forks streams of their own: draws in one leave another’s as they were', () => {
    const a = seeded(9);
    const workload = a.fork('workload');
    const faults = a.fork('faults');
    const before = Array.from({ length: 4 }, () => faults.next());
    const b = seeded(9);
    const busy = b.fork('workload');
    for (let i = 0; i < 100; i++) busy.next();
    const again = b.fork('faults');
    expect(Array.from({ length: 4 }, () => again.next())).toEqual(before);
    expect(workload.next()).not.toBe(before[0]);
  });
});

describe('systemRandom', () => {
  it('draws from Math.random, in range', () => {
    for (let i = 0; i < 100; i++) expect(systemRandom.int(6)).toBeLessThan(6);
  });
});
