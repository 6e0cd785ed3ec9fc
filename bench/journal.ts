/**
 * Journal benchmark: append throughput and latency through the real append path at both
 * durability levels, against a bare better-sqlite3 insert loop measured in the same run; event-loop
 * delay while appending; replay and verify speed against a bare iterate-and-fold. What the append
 * targets run into is measured in the same run too: the writer's own code inline (no queue, no
 * thread) and the disk writing as many pages as a commit does.
 *
 *   npm run bench:journal                 # full run (builds a 1,000,000-event journal)
 *   npm run bench:journal -- --quick      # smaller figures, for a first look
 *   npm run bench:journal -- --json       # one JSON object with stable keys
 *   npm run bench:journal -- --backend postgres   # the PostgreSQL journal (bench/journal-postgres.ts)
 */
import {
  closeSync,
  fdatasyncSync,
  mkdtempSync,
  openSync,
  readFileSync,
  rmSync,
  writeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { SqliteJournal } from '../src/journal/sqlite/journal.ts';
import { MIGRATIONS_DIR } from '../src/journal/sqlite/migrate.ts';
import { foldJournal, verifyJournal } from '../src/journal/sqlite/verify.ts';
import { completedRoomEvents, synthEvents } from '../src/journal/synth.ts';
import { eventKey } from '../src/room/event-keys.ts';
import { uuidv7 } from '../src/room/ids.ts';
import { type AppendRun, appendRun } from './append-run.ts';
import { asJson, checkFlags, flag, has } from './args.ts';
import { inlineWriter } from './inline-writer.ts';
import { postgresBench } from './journal-postgres.ts';

const backend = flag('--backend', 'sqlite');
const quick = has('--quick');
const replayEvents = Number(flag('--events', '0')) || (quick ? 100_000 : 1_000_000);
const url = flag('--url', '') || undefined;
checkFlags();
if (backend !== 'sqlite' && backend !== 'postgres') {
  process.stderr.write(`--backend must be sqlite or postgres, got "${backend}"\n`);
  process.exit(2);
}
if (backend === 'postgres') {
  await postgresBench({ asJson, quick, url });
  process.exit(0);
}
const secondsPerRun = quick ? 1.5 : 4;
const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-'));
process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
const log = (s: string) => {
  if (!asJson) process.stderr.write(`${s}\n`);
};

/**
 * The machine's limit for the same number of rows: a bare loop inserting into the `events` table of
 * migration 0001 (same columns and indexes), all in one transaction.
 */
function bareInsert(
  durability: 'process' | 'power',
  rows: number,
  ids: 'uuidv7' | 'random',
): number {
  const path = join(dir, `bare-${durability}-${ids}.db`);
  const db = new Database(path);
  db.pragma('journal_mode = WAL');
  db.pragma(`synchronous = ${durability === 'power' ? 'FULL' : 'NORMAL'}`);
  db.pragma('cache_size = -65536');
  db.exec(readFileSync(join(MIGRATIONS_DIR, '0001_initial.sql'), 'utf8'));
  const insert = db.prepare(
    'INSERT INTO events (ts, type, room, engine, source, event_id, data) VALUES (?, ?, ?, ?, ?, ?, ?)',
  );
  const data = JSON.stringify(completedRoomEvents('r')[5]?.data); // a transfer_completed row
  // Stored as the journal stores them (schema 5: journal/event-keys.ts).
  const eventIds = Array.from({ length: rows }, () =>
    eventKey(ids === 'uuidv7' ? uuidv7() : crypto.randomUUID(), 'p0'),
  );
  const t = performance.now();
  db.transaction(() => {
    for (let i = 0; i < rows; i++)
      insert.run(
        Date.now(),
        'room.transfer_completed',
        `r-${(i >> 3).toString(36)}`,
        'p0',
        'p0',
        eventIds[i],
        data,
      );
  }).immediate();
  const perSec = Math.round(rows / ((performance.now() - t) / 1000));
  db.close();
  rmSync(path, { force: true });
  return perSec;
}

/**
 * The disk's limit for one-event commits at `power`: a loop of `pages` 4 KiB writes and one
 * fdatasync, in this directory, cycling over a 4 MiB file as a reused WAL does. Loops per second.
 * With `pages` 1 it is the baseline of the single-appender target; with the WAL frames one commit
 * writes, it is what SQLite's commit would cost if it did nothing but write and sync.
 */
function fdatasyncLoop(seconds: number, pages = 1): number {
  const path = join(dir, 'fdatasync.bin');
  const fd = openSync(path, 'w');
  const page = Buffer.alloc(4096, 7);
  const slots = 1024;
  for (let i = 0; i < slots; i++) writeSync(fd, page, 0, page.length, i * page.length);
  fdatasyncSync(fd);
  let n = 0;
  let slot = 0;
  const t = performance.now();
  const end = t + seconds * 1000;
  while (performance.now() < end) {
    for (let p = 0; p < pages; p++) {
      writeSync(fd, page, 0, page.length, slot * page.length);
      slot = (slot + 1) % slots;
    }
    fdatasyncSync(fd);
    n++;
  }
  const perSec = Math.round(n / ((performance.now() - t) / 1000));
  closeSync(fd);
  rmSync(path, { force: true });
  return perSec;
}

async function replayRun() {
  const path = join(dir, 'replay.db');
  const journal = await SqliteJournal.open({ path });
  const endTs = Date.now();
  const rooms = Math.ceil(replayEvents / 9.9);
  let written = 0;
  const window = new Set<Promise<unknown>>();
  const t0 = performance.now();
  let lastNote = t0;
  for (const ev of synthEvents({
    rooms,
    seed: 11,
    spanMs: 3_600_000,
    endTs,
    prefill: ['p0', 'p1'],
    decode: ['d0', 'd1'],
  })) {
    if (written >= replayEvents) break;
    const p = journal.append(ev).finally(() => window.delete(p));
    window.add(p);
    written++;
    if (window.size >= 4096) await Promise.race(window);
    if (performance.now() - lastNote > 2000) {
      lastNote = performance.now();
      log(`  writing the replay journal: ${written}/${replayEvents} events`);
    }
  }
  await Promise.all(window);
  await journal.drain();
  const db = new Database(path, { readonly: true });
  const total = db.prepare('SELECT count(*) FROM events').pluck().get() as number;
  // Baseline: every row read and its data parsed, folded into the simplest state map.
  let t = performance.now();
  const bare = new Map<string, string>();
  for (const row of db
    .prepare('SELECT seq, ts, type, room, engine, data FROM events ORDER BY seq')
    .raw()
    .iterate() as IterableIterator<unknown[]>) {
    JSON.parse(row[5] as string);
    if (row[3] !== null) bare.set(row[3] as string, row[2] as string);
  }
  const bareSec = (performance.now() - t) / 1000;
  t = performance.now();
  const fold = foldJournal(db);
  const foldSec = (performance.now() - t) / 1000;
  t = performance.now();
  const report = verifyJournal(db);
  const verifySec = (performance.now() - t) / 1000;
  db.close();
  if (!report.ok || fold.inconsistent.length) throw new Error('replay journal failed verification');
  return {
    events: total,
    rooms: fold.rooms.size,
    bareFoldEventsPerSec: Math.round(total / bareSec),
    replayEventsPerSec: Math.round(total / foldSec),
    replayRatio: Number((bareSec / foldSec).toFixed(3)),
    verifyEventsPerSec: Math.round(total / verifySec),
    verifyRatio: Number((bareSec / verifySec).toFixed(3)),
    verifySeconds: Number(verifySec.toFixed(2)),
  };
}

log('fdatasync loop: one 4 KiB write + fdatasync, median of 3');
const fdatasyncPerSec = [0, 1, 2]
  .map(() => fdatasyncLoop(quick ? 0.5 : 1))
  .sort((a, b) => a - b)[1] as number;
log('the writer inline (no queue, no thread): one-event commits, then batches of 256');
const inline = inlineWriter(dir, quick ? 1 : 2, 256);
log(`a loop of ${Math.round(inline.frames)} page writes + fdatasync, median of 3`);
const rawFramesPages = Math.round(inline.frames);
const rawFramesPerSec = [0, 1, 2]
  .map(() => fdatasyncLoop(quick ? 0.5 : 1, rawFramesPages))
  .sort((a, b) => a - b)[1] as number;
const runs: AppendRun[] = [];
for (const durability of ['process', 'power'] as const) {
  for (const appenders of [1, 16, 256]) {
    log(`append: durability=${durability} appenders=${appenders} (${secondsPerRun}s)`);
    const journal = await SqliteJournal.open({
      path: join(dir, `append-${durability}-${appenders}.db`),
      durability,
    });
    runs.push(await appendRun(journal, durability, appenders, secondsPerRun));
  }
}
const bare: Record<string, number> = {};
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1] as number;
for (const durability of ['process', 'power'] as const) {
  const rows =
    runs.find((r) => r.durability === durability && r.appenders === 256)?.events ?? 100_000;
  log(`bare insert loop: durability=${durability}, ${rows} rows, median of 3`);
  bare[durability] = median([0, 1, 2].map(() => bareInsert(durability, rows, 'uuidv7')));
  bare[`${durability}RandomIds`] = median(
    [0, 1, 2].map(() => bareInsert(durability, rows, 'random')),
  );
}
log(`replay: building a ${replayEvents}-event journal through the append path`);
const replay = await replayRun();

const result = {
  machine: {
    cpus: (await import('node:os')).cpus().length,
    node: process.version,
    sqlite: new Database(':memory:').prepare('SELECT sqlite_version()').pluck().get() as string,
  },
  secondsPerRun,
  append: runs.map((r) => ({
    ...r,
    bareRowsPerSec: bare[r.durability] as number,
    ratioToBare: Number((r.appendsPerSec / (bare[r.durability] as number)).toFixed(3)),
  })),
  bareInsert: bare,
  fdatasyncPerSec,
  /** One appender at `power`: appends/s over the fdatasync loop's rate (target ≥ 0.7). */
  powerSingleToFdatasync: Number(
    (
      (runs.find((r) => r.durability === 'power' && r.appenders === 1)?.appendsPerSec ?? 0) /
      fdatasyncPerSec
    ).toFixed(3),
  ),
  walFramesPerCommit: inline.frames,
  pageSize: inline.pageSize,
  /**
   * What the targets run into, measured in this run: the writer's own work inline (no queue, no
   * thread) against the same baselines, and the disk writing as many pages as a commit does.
   */
  limits: {
    inlineOneEventPerSec: inline.oneEventPerSec,
    inlineOneEventToFdatasync: Number((inline.oneEventPerSec / fdatasyncPerSec).toFixed(3)),
    rawFramesPages,
    rawFramesPerSec,
    rawFramesToFdatasync: Number((rawFramesPerSec / fdatasyncPerSec).toFixed(3)),
    inlineBatch: 256,
    inlineBatchPerSec: inline.batchPerSec,
    inlineBatchToBare: Number(((inline.batchPerSec ?? 0) / (bare.power as number)).toFixed(3)),
  },
  replay,
};

if (asJson) {
  process.stdout.write(`${JSON.stringify(result)}\n`);
} else {
  const pad = (s: string | number, n: number) => String(s).padStart(n);
  const powerRun = (appenders: number) =>
    result.append.find((r) => r.durability === 'power' && r.appenders === appenders);
  const lim = result.limits;
  const lines = [
    `pdctl journal benchmark — ${result.machine.cpus} cores, node ${result.machine.node}, SQLite ${result.machine.sqlite}, ${secondsPerRun}s per append run`,
    '',
    '| durability | appenders | appends/s | bare loop rows/s | ratio | p50 ms | p99 ms | avg batch | loop delay p99 ms |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...result.append.map(
      (r) =>
        `| ${r.durability} | ${pad(r.appenders, 3)} | ${pad(r.appendsPerSec, 7)} | ${pad(r.bareRowsPerSec, 7)} | ${r.ratioToBare.toFixed(2)} | ${r.p50Ms.toFixed(3)} | ${r.p99Ms.toFixed(3)} | ${r.avgBatch} | ${r.loopDelayP99Ms.toFixed(2)} |`,
    ),
    '',
    `one appender at power: ${powerRun(1)?.appendsPerSec} appends/s; a loop of one 4 KiB write + fdatasync on the same disk: ${fdatasyncPerSec}/s; ratio ${result.powerSingleToFdatasync.toFixed(2)} (target ≥ 0.7)`,
    `WAL frames per one-event commit: ${result.walFramesPerCommit} (${result.pageSize}-byte pages; each a page and a 24-byte header)`,
    '',
    'What the append path runs into, measured in this run: the writer inline is its own code committing on',
    'this thread with no queue, no thread hop and no promises — the most the journal could reach on SQLite.',
    '',
    '| at power | per second | ratio | of |',
    '|---|---:|---:|---|',
    `| one appender, through the journal | ${powerRun(1)?.appendsPerSec} | ${result.powerSingleToFdatasync.toFixed(2)} | the fdatasync loop |`,
    `| one-event commits, the writer inline | ${lim.inlineOneEventPerSec} | ${lim.inlineOneEventToFdatasync.toFixed(2)} | the fdatasync loop |`,
    `| ${lim.rawFramesPages} page writes + fdatasync (a commit's frames, nothing else) | ${lim.rawFramesPerSec} | ${lim.rawFramesToFdatasync.toFixed(2)} | the fdatasync loop |`,
    `| 256 appenders, through the journal | ${powerRun(256)?.appendsPerSec} | ${powerRun(256)?.ratioToBare.toFixed(2)} | the bare loop |`,
    `| batches of ${lim.inlineBatch} events, the writer inline | ${lim.inlineBatchPerSec} | ${lim.inlineBatchToBare.toFixed(2)} | the bare loop |`,
    '',
    `bare loop with random UUID event ids instead of time-ordered ones: process ${bare.processRandomIds} rows/s (${((bare.processRandomIds as number) / (bare.process as number)).toFixed(2)}×), power ${bare.powerRandomIds} rows/s (${((bare.powerRandomIds as number) / (bare.power as number)).toFixed(2)}×)`,
    '',
    `| replay over ${replay.events} events, ${replay.rooms} rooms | events/s | ratio to bare |`,
    '|---|---:|---:|',
    `| bare iterate + JSON.parse + map fold (baseline) | ${replay.bareFoldEventsPerSec} | 1.00 |`,
    `| replay: full reducer fold | ${replay.replayEventsPerSec} | ${replay.replayRatio.toFixed(2)} |`,
    `| verify: integrity_check + fold + compare projection | ${replay.verifyEventsPerSec} | ${replay.verifyRatio.toFixed(2)} |`,
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}
