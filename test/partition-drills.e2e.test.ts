/**
 * The partition drills (src/drills/partition.ts), each on test hosts of its own: the link between
 * the prefill host and a decode host cut during UCX transfers, and a decode engine's host cut off
 * from the control plane. Run side by side (they share nothing) to keep CI's wall time down.
 */
import { describe, expect, it } from 'vitest';
import { testHostsUnavailable } from '../src/drills/hosts.ts';
import type { DrillReport } from '../src/drills/report.ts';
import { ucxBackend } from '../src/transfer/ucx.ts';
import { pdctl } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';

const why = testHostsUnavailable() ?? (ucxBackend().available ? null : ucxBackend().reason);

async function drill(scenario: string): Promise<DrillReport> {
  const r = await pdctl(['drill', scenario, '--data-dir', tempDir('pdctl-partition-'), '--json'], {
    timeoutMs: 110_000,
  });
  const report = JSON.parse(r.stdout || 'null') as DrillReport | null;
  const failed = report?.invariants.filter((i) => !i.ok && !i.target) ?? [];
  expect(failed, `${scenario}: ${r.stderr.slice(-2000)}\n${JSON.stringify(failed)}`).toEqual([]);
  expect(r.code).toBe(0);
  console.log(
    `${scenario}: ${(report as DrillReport).invariants
      .map((i) => `${i.name} ${JSON.stringify(i.figure)}`)
      .join('; ')}`,
  );
  return report as DrillReport;
}

const figure = (r: DrillReport, name: string) => r.invariants.find((i) => i.name === name)?.figure;

describe.skipIf(why !== null)(`partition drills${why ? ` (skipped: ${why})` : ''}`, () => {
  it('partition-kv and partition-engine: rooms end in time or move, engines fenced and back, nothing leaked', async () => {
    const [kv, engine] = await Promise.all([drill('partition-kv'), drill('partition-engine')]);

    // The cut pair: its transfers failed and were counted, rooms created meanwhile went around
    // it (a probe or two may try it), and both ends were timed.
    const counted = figure(kv, 'the cut’s failed transfers counted in /metrics');
    expect(Number(counted?.failedRooms)).toBeGreaterThan(0);
    expect(Number(counted?.counted)).toBeGreaterThanOrEqual(Number(counted?.failedRooms));
    const around = figure(kv, 'rooms created during the partition avoid the cut pair');
    expect(Number(around?.rooms)).toBeGreaterThan(0);
    expect(Number(around?.toCutPair)).toBeLessThanOrEqual(2);
    for (const r of [kv, engine]) {
      const timed = figure(r, 'time to detect and to recover');
      expect(Number(timed?.detectMs), r.scenario).toBeGreaterThanOrEqual(0);
      expect(Number(timed?.recoverMs), r.scenario).toBeGreaterThanOrEqual(0);
    }
    expect(figure(kv, 'engines on the healthy side not restarted')).toEqual({
      engines: 3,
      of: 3,
    });

    // The cut engine: fenced, its streams migrated with the same text, back as a new incarnation.
    expect(
      figure(engine, 'the partitioned engine was fenced and rejoined as a new incarnation')?.starts,
    ).toBeGreaterThanOrEqual(2);
    expect(figure(engine, 'no stale append of the fenced incarnation applied')?.staleEvents).toBe(
      0,
    );
    expect(figure(engine, 'engines on the healthy side not restarted')).toEqual({
      engines: 2,
      of: 2,
    });
    for (const r of [kv, engine]) {
      expect(figure(r, 'zero leaked pages')?.pages).toBe(0);
      expect(figure(r, 'every answer served is the right one')?.wrong).toBe(0);
      expect(r.invariants.find((i) => i.name === 'journal verify passes')?.ok).toBe(true);
    }
  }, 120_000);
});
