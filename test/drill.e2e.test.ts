/** `pdctl drill abort-cascade` in its quick form: a real stack, real HTTP clients dropped at once. */
import { describe, expect, it } from 'vitest';
import type { DrillReport } from '../src/recovery/drills/report.ts';
import { pdctl } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';

describe('pdctl drill', () => {
  it('abort-cascade: every dropped client’s room ends aborted, no page leaks, the next request succeeds', async () => {
    const dir = tempDir('pdctl-drill-');
    const r = await pdctl(
      ['drill', 'abort-cascade', '--clients', '40', '--data-dir', dir, '--json'],
      { timeoutMs: 90_000 },
    );
    expect(r.code, r.stderr).toBe(0);
    const report = JSON.parse(r.stdout) as DrillReport & { journal: string };
    expect(report.passed).toBe(true);
    expect(report.invariants.map((i) => [i.name, i.ok])).toEqual([
      ['every room terminal within target', true],
      ['every room aborted by its client', true],
      ['each engine released each room once', true],
      ['zero leaked pages', true],
      ['journal verify passes', true],
      ['the next request succeeds', true],
    ]);
    expect(report.invariants[1]?.figure).toEqual({ rooms: 40 });
    // The drill is in the journal it ran on.
    const tail = await pdctl([
      'journal',
      'tail',
      '--type',
      'drill.finished',
      '--journal',
      report.journal,
      '--json',
    ]);
    // One JSON event per line.
    expect(JSON.parse(tail.stdout.trim().split('\n')[0] as string)).toMatchObject({
      type: 'drill.finished',
      data: { scenario: 'abort-cascade', passed: true },
    });
    const bad = await pdctl(['drill', 'melt-down']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/Allowed choices are abort-cascade/);
  }, 120_000);
});
