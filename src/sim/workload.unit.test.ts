import { describe, expect, it } from 'vitest';
import { seeded } from '../ports/random.ts';
import { workload } from './workload.ts';

describe('the seeded workload', () => {
  it('is the same for the same seed, and another for another', () => {
    expect(workload(seeded(11))).toEqual(workload(seeded(11)));
    expect(workload(seeded(11))).not.toEqual(workload(seeded(12)));
  });

  it('keeps arrivals as they were when only the prompts’ options change (each part draws its own stream)', () => {
    const a = workload(seeded(5), { promptWords: [4, 8] });
    const b = workload(seeded(5), { promptWords: [30, 40] });
    expect(a.map((r) => r.at)).toEqual(b.map((r) => r.at));
    expect(a.map((r) => r.prompt)).not.toEqual(b.map((r) => r.prompt));
  });

  it('arrives as a Poisson process of the rate asked, in order', () => {
    const rs = workload(seeded(1), { requests: 5000, perSecond: 100 });
    for (let i = 1; i < rs.length; i++)
      expect((rs[i]?.at as number) >= (rs[i - 1]?.at as number)).toBe(true);
    // 5,000 arrivals at 100/s take about 50 s: within 5 % (the sd of the sum is 1.4 %).
    expect(Math.abs((rs.at(-1)?.at as number) - 50_000)).toBeLessThan(2500);
  });

  it('shares prefixes, and draws lengths, clients and their actions as asked', () => {
    const rs = workload(seeded(2), {
      requests: 2000,
      prefixes: 3,
      prefixShare: 0.5,
      prefixWords: [10, 10],
      promptWords: [2, 3],
      maxTokens: [4, 6],
      streamShare: 0.25,
      abortShare: 0.1,
      disconnectShare: 0.2,
      actWithinMs: 50,
    });
    const share = (f: (r: (typeof rs)[number]) => boolean) => rs.filter(f).length / rs.length;
    expect(Math.abs(share((r) => r.prefix !== null) - 0.5)).toBeLessThan(0.05);
    expect(Math.abs(share((r) => r.stream) - 0.25)).toBeLessThan(0.05);
    expect(Math.abs(share((r) => r.action?.kind === 'abort') - 0.1)).toBeLessThan(0.03);
    expect(Math.abs(share((r) => r.action?.kind === 'disconnect') - 0.2)).toBeLessThan(0.04);
    const byPrefix = new Map<number, string>();
    for (const r of rs) {
      const words = r.prompt.split(' ');
      if (r.prefix === null) expect(words.length).toBeLessThanOrEqual(3);
      else {
        expect(words.length).toBeGreaterThanOrEqual(12);
        // Every prompt of one prefix starts with the same ten words.
        const head = words.slice(0, 10).join(' ');
        expect(byPrefix.get(r.prefix) ?? head).toBe(head);
        byPrefix.set(r.prefix, head);
      }
      expect(r.maxTokens >= 4 && r.maxTokens <= 6).toBe(true);
      if (r.action) expect(r.action.afterMs >= 0 && r.action.afterMs <= 50).toBe(true);
    }
    expect(byPrefix.size).toBe(3);
    expect(new Set(rs.map((r) => r.id)).size).toBe(rs.length);
  });

  it('refuses options that make no sense, naming them', () => {
    expect(() => workload(seeded(1), { perSecond: 0 })).toThrow(/perSecond/);
    expect(() => workload(seeded(1), { streamShare: 1.5 })).toThrow(/streamShare/);
    expect(() => workload(seeded(1), { maxTokens: [5, 2] })).toThrow(/maxTokens\[1\]/);
    expect(() => workload(seeded(1), { abortShare: 0.6, disconnectShare: 0.6 })).toThrow(
      /abortShare \+ disconnectShare/,
    );
  });
});
