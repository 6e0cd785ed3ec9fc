/**
 * One closed-loop append run against a journal of either backend: `appenders` callers, each
 * walking rooms through their whole lifecycle and awaiting every append before the next, for
 * `seconds`. Shared by bench/journal.ts (SQLite) and bench/journal-postgres.ts.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { Durability, JournalStore } from '../src/journal/store.ts';
import { completedRoomEvents } from '../src/journal/synth.ts';

export interface AppendRun {
  durability: Durability;
  appenders: number;
  events: number;
  appendsPerSec: number;
  p50Ms: number;
  p99Ms: number;
  loopDelayP99Ms: number;
  avgBatch: number;
}

/** The p-th percentile of ascending samples (0 for none). */
export function percentile(sorted: Float64Array, p: number): number {
  return sorted.length
    ? (sorted[Math.min(sorted.length - 1, Math.floor((sorted.length * p) / 100))] as number)
    : 0;
}

/** Runs the appenders against `journal` (fresh, opened at `durability`), then drains it. */
export async function appendRun(
  journal: JournalStore,
  durability: Durability,
  appenders: number,
  seconds: number,
): Promise<AppendRun> {
  const latencies = new Float64Array(5_000_000);
  let n = 0;
  let roomSeq = 0;
  const loop = monitorEventLoopDelay({ resolution: 1 });
  const commitsBefore = journal.health().commits;
  const started = performance.now();
  const deadline = started + seconds * 1000;
  loop.enable();
  const appender = async () => {
    while (performance.now() < deadline) {
      for (const ev of completedRoomEvents(`r-${(roomSeq++).toString(36)}`)) {
        const t = performance.now();
        await journal.append(ev);
        latencies[n++] = performance.now() - t;
      }
    }
  };
  await Promise.all(Array.from({ length: appenders }, appender));
  const elapsed = (performance.now() - started) / 1000;
  loop.disable();
  const commits = journal.health().commits - commitsBefore;
  await journal.drain();
  const sorted = latencies.subarray(0, n).sort();
  return {
    durability,
    appenders,
    events: n,
    appendsPerSec: Math.round(n / elapsed),
    p50Ms: Number(percentile(sorted, 50).toFixed(3)),
    p99Ms: Number(percentile(sorted, 99).toFixed(3)),
    loopDelayP99Ms: Number((loop.percentile(99) / 1e6).toFixed(2)),
    avgBatch: Number((n / Math.max(1, commits)).toFixed(1)),
  };
}
