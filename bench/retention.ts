/**
 * What retention while serving costs the appends it runs beside: a SQLite journal (durability
 * `power`, the default) is filled with rooms that ended a day ago, then appenders walk new rooms
 * through their lifecycle (a) with no prune, (b) beside a retention pass as `pdctl serve
 * --retain` and `journal prune --url` run it (100 rooms per transaction, resting as long as each
 * chunk took), (c) beside a prune at full speed, 500 rooms per transaction (`journal prune` on a
 * stopped journal). Phases interleave so the machine's drift hits all alike. The baseline is (a),
 * in the same run; the ratio is append p99 beside a prune over p99 without. A fourth phase packs
 * the day-old rooms instead (schema 8), as a serving control plane does 5 minutes after rooms end:
 * 16 rooms per transaction (64 on PostgreSQL; `--pack-chunks`), resting as long as each took.
 *
 *   npm run bench:retention                          # a table
 *   npm run bench:retention -- --rooms 250000 --seconds 5 --appenders 16 --rounds 3 --json
 *   npm run bench:retention -- --serve-chunks 25,50,100   # the serve pass at each chunk size
 *   npm run bench:retention -- --pack-chunks 16,32        # packing at each chunk size
 *   npm run bench:retention -- --backend postgres         # a PostgreSQL journal (throwaway cluster)
 *
 * On PostgreSQL the journal is a fresh database of a throwaway cluster (initdb, fsync on, on a
 * loopback port), or of the server whose admin URL `--url` gives.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { drillPostgres, openJournal } from '../src/app/journal.ts';
import { PACK_ROOMS_PER_PASS } from '../src/journal/packs.ts';
import { PG_PACK_ROOMS_PER_PASS, type PgJournal } from '../src/journal/postgres/journal.ts';
import { DEFAULT_CHUNK_ROOMS, Retention } from '../src/journal/retention.ts';
import type { SqliteJournal } from '../src/journal/sqlite/journal.ts';
import type { JournalStore } from '../src/journal/store.ts';
import { completedRoomEvents, synthEvents } from '../src/journal/synth.ts';
import { silentLogger } from '../src/log.ts';
import { systemClock } from '../src/ports/clock.ts';
import type { EventInput } from '../src/room/events.ts';
import { asJson, checkFlags, flag, percentile, say } from './args.ts';

const ROOMS = Number(flag('--rooms', '250000'));
const SECONDS = Number(flag('--seconds', '5'));
const APPENDERS = Number(flag('--appenders', '16'));
const ROUNDS = Number(flag('--rounds', '3'));
const BACKEND = flag('--backend', 'sqlite');
const ADMIN_URL = flag('--url', '') || undefined;
if (BACKEND !== 'sqlite' && BACKEND !== 'postgres') {
  process.stderr.write(`--backend must be sqlite or postgres, got "${BACKEND}"\n`);
  process.exit(2);
}

interface Phase {
  phase: string;
  appendsPerSec: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  /** Rooms pruned, or packed in the packing phase. */
  roomsPerSec: number;
}

/** Writes ROOMS synthetic rooms that ended about a day ago, through the real append path. */
async function fill(journal: JournalStore, round: number): Promise<void> {
  const day = 86_400_000;
  const t0 = performance.now();
  const window: Promise<unknown>[] = [];
  const events = synthEvents({
    rooms: ROOMS,
    seed: 7 + round,
    spanMs: 3_600_000,
    endTs: Date.now() - day - round * 7_200_000,
    prefill: ['p0', 'p1'],
    decode: ['d0', 'd1'],
  });
  let n = 0;
  for (const ev of events as Iterable<EventInput>) {
    window.push(journal.append(ev));
    n++;
    if (window.length >= 2048) await Promise.all(window.splice(0));
  }
  await Promise.all(window);
  say(
    `filled: ${ROOMS} rooms, ${n} events, ended a day ago, in ${((performance.now() - t0) / 1000).toFixed(1)} s`,
  );
}

let roomSeq = 0;

const SERVE_CHUNKS = flag('--serve-chunks', String(DEFAULT_CHUNK_ROOMS)).split(',').map(Number);
const PACK_CHUNKS = flag(
  '--pack-chunks',
  String(BACKEND === 'postgres' ? PG_PACK_ROOMS_PER_PASS : PACK_ROOMS_PER_PASS),
)
  .split(',')
  .map(Number);
checkFlags();
const PHASES = [
  'no prune',
  // Before the prunes, which leave no day-old room to pack (and then prune packed rooms).
  ...PACK_CHUNKS.map((c) => `packing, ${c} rooms/tx`),
  ...SERVE_CHUNKS.map((c) => `retention pass, ${c} rooms/tx`),
  'full speed, 500 rooms/tx',
];

/** Closed-loop appenders for SECONDS, beside a prune of the day-old rooms (or none). */
async function phase(journal: JournalStore, name: string): Promise<Phase> {
  const ms: number[] = [];
  const deadline = performance.now() + SECONDS * 1000;
  const stop = new AbortController();
  const started = performance.now();
  const hour = 3_600_000;
  const retention = new Retention(journal, null, silentLogger, systemClock);
  const pruning: Promise<{ rooms: number }> =
    name === 'no prune'
      ? Promise.resolve({ rooms: 0 })
      : name.startsWith('packing')
        ? (journal as SqliteJournal | PgJournal).pack(Date.now() - hour, {
            pace: true,
            signal: stop.signal,
            roomsPerPass: Number(/, (\d+) rooms/.exec(name)?.[1]),
          })
        : name.startsWith('retention pass')
          ? (async () => {
              const chunkRooms = Number(/, (\d+) rooms/.exec(name)?.[1]);
              retention.runNow({ roomsMs: hour, eventsMs: null, chunkRooms });
              await new Promise((r) => stop.signal.addEventListener('abort', r));
              await retention.stop();
              return retention.status().last?.result ?? { rooms: 0 };
            })()
          : journal.prune({ cutoffTs: Date.now() - hour, chunkRooms: 500, signal: stop.signal });
  const appender = async () => {
    while (performance.now() < deadline) {
      for (const ev of completedRoomEvents(`b-${(roomSeq++).toString(36)}`)) {
        const t = performance.now();
        await journal.append(ev);
        ms.push(performance.now() - t);
      }
    }
  };
  await Promise.all(Array.from({ length: APPENDERS }, appender));
  const elapsed = (performance.now() - started) / 1000;
  stop.abort();
  const pruned = await pruning;
  ms.sort((a, b) => a - b);
  return {
    phase: name,
    appendsPerSec: Math.round(ms.length / elapsed),
    p50Ms: Number(percentile(ms, 50).toFixed(2)),
    p99Ms: Number(percentile(ms, 99).toFixed(2)),
    maxMs: Number((ms.at(-1) ?? 0).toFixed(1)),
    roomsPerSec: Math.round(pruned.rooms / elapsed),
  };
}

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-retention-'));
  const pg =
    BACKEND === 'postgres'
      ? await drillPostgres(ADMIN_URL, `pdctl_bench_retention_${Date.now()}`)
      : null;
  if (pg?.throwaway) say('a throwaway PostgreSQL cluster (initdb, fsync on) on a loopback port');
  const path = pg?.url ?? join(dir, 'journal.db');
  const journal = await openJournal({ path, durability: 'power', log: silentLogger });
  try {
    const phases: Phase[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      await fill(journal, round);
      for (const name of PHASES) {
        const p = await phase(journal, name);
        phases.push(p);
        say(
          `  round ${round + 1}: ${p.phase.padEnd(30)} ${String(p.appendsPerSec).padStart(6)} appends/s  p50 ${p.p50Ms} ms  p99 ${p.p99Ms} ms  max ${p.maxMs} ms  ${p.roomsPerSec} rooms pruned or packed/s`,
        );
      }
    }
    const of = (name: string) => phases.filter((p) => p.phase === name);
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? 0;
    const base = median(of('no prune').map((p) => p.p99Ms));
    const rows = PHASES.map((name) => ({
      phase: name,
      appendsPerSec: median(of(name).map((p) => p.appendsPerSec)),
      p50Ms: median(of(name).map((p) => p.p50Ms)),
      p99Ms: median(of(name).map((p) => p.p99Ms)),
      roomsPerSec: median(of(name).map((p) => p.roomsPerSec)),
      p99VsNoPrune: Number((median(of(name).map((p) => p.p99Ms)) / base).toFixed(2)),
    }));
    if (asJson) {
      const result = { rooms: ROOMS, seconds: SECONDS, appenders: APPENDERS, rows };
      process.stdout.write(`${JSON.stringify(result)}\n`);
      return;
    }
    const lines = [
      `${BACKEND === 'postgres' ? 'PostgreSQL' : 'SQLite'}, ${APPENDERS} appenders, durability power, medians of ${ROUNDS} rounds of ${SECONDS} s`,
      '| phase | appends/s | p50 ms | p99 ms | rooms pruned or packed/s | p99 vs no prune |',
      '|---|---:|---:|---:|---:|---:|',
      ...rows.map(
        (r) =>
          `| ${r.phase} | ${r.appendsPerSec} | ${r.p50Ms} | ${r.p99Ms} | ${r.roomsPerSec} | ${r.p99VsNoPrune} |`,
      ),
    ];
    process.stdout.write(`${lines.join('\n')}\n`);
  } finally {
    await journal.drain();
    pg?.dispose();
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
