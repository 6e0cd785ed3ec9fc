/**
 * Start-up against history: `pdctl serve` (a real process, its engines) started on an empty
 * journal and on a journal of N synthetic rooms (`pdctl journal synth`, about ten events a room),
 * timed from spawn to `/health/ready`. On the big journal, the first start has no state
 * checkpoint (it folds the whole journal, then writes one); each later start follows a SIGKILL of
 * the whole process group, as a host crash would, and reads the checkpoint plus the events after
 * it. Empty and big starts alternate, so the machine's drift hits both alike; the figure is the
 * difference of medians, big minus empty.
 *
 *   npm run bench:startup                              # 1,000,000 rooms (~10 M events, ~3 GB)
 *   npm run bench:startup -- --rooms 200000 --rounds 3 --json
 *   npm run bench:startup -- --journal /data/journal.db   # a copy of this journal instead
 *   npm run bench:startup -- --url postgres://…/db   # PostgreSQL: fills db, empty ones beside it
 *   npm run bench:startup -- --url postgres://…/db --filled   # db holds the journal already
 *   npm run bench:startup -- --url postgres://…/db --filled --failover   # and failovers, timed
 *     from the leader's SIGKILL to the standby's /health/ready
 */
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import Database from 'better-sqlite3';
import { drillPostgres } from '../src/app/journal.ts';
import { asJson, checkFlags, flag, has, say } from './args.ts';
import {
  journalBytes,
  killGroup,
  type Server,
  startServe,
  stop,
  timedStart,
  waitReady,
} from './serve-process.ts';

const ROOMS = Number(flag('--rooms', '1000000'));
const ROUNDS = Number(flag('--rounds', '3'));
const JOURNAL = flag('--journal', '');
const URL = flag('--url', '');
/** With --url: the database already holds the journal to start on (no synth). */
const FILLED = has('--filled');
/** With --url: then time failovers to a standby, on an empty journal and on the big one. */
const FAILOVER = has('--failover');
checkFlags();
const BIN = resolve(import.meta.dirname, '../bin/pdctl.js');

interface Start {
  ms: number;
  rebuildMs: Record<string, number>;
  checkpointSeq: number | null;
  foldedEvents: number;
}

/** A timed start on `dir` (and the PostgreSQL journal `url` when given); killed or stopped after. */
async function start(dir: string, url: string, end: 'kill' | 'stop'): Promise<Start> {
  const extra = url ? ['--journal', url] : [];
  const { server, ms } = await timedStart(dir, extra, 'info');
  // The first start on a journal with no checkpoint writes one within a second of its first
  // committed event; give it that before the crash.
  await new Promise((r) => setTimeout(r, 2500));
  const result = startOf(server, ms);
  if (end === 'kill') await killGroup(server);
  else await stop(server);
  return result;
}

/** The start's figures from serve's own `started` log line. */
function startOf(server: Server, ms: number): Start {
  const line = server.lines.find((l) => l.includes('"msg":"started"'));
  const started = line ? JSON.parse(line) : {};
  return {
    ms,
    rebuildMs: started.rebuildMs ?? {},
    checkpointSeq: started.checkpointSeq ?? null,
    foldedEvents: started.foldedEvents ?? 0,
  };
}

/**
 * A failover on the PostgreSQL journal at `url`: a leader and a standby (`--standby`), the
 * leader's process group SIGKILLed once the standby stands by; ms from the kill to the standby's
 * `/health/ready`.
 */
async function failover(url: string, dir: string): Promise<Start> {
  const leaderDir = join(dir, 'leader');
  const standbyDir = join(dir, 'standby');
  for (const d of [leaderDir, standbyDir]) rmSync(d, { recursive: true, force: true });
  mkdirSync(leaderDir);
  mkdirSync(standbyDir);
  const leader = await timedStart(leaderDir, ['--journal', url], 'warn');
  let standingBy: () => void = () => {};
  const waiting = new Promise<void>((r) => {
    standingBy = r;
  });
  const onLine = (line: string) => {
    if (line.includes('standing by')) standingBy();
  };
  const standbyUp = startServe(standbyDir, ['--journal', url, '--standby'], 'info', onLine);
  await waiting;
  // The leader writes its state checkpoint within a second of its start.
  await new Promise((r) => setTimeout(r, 2500));
  const t0 = performance.now();
  await killGroup(leader.server);
  const standby = await standbyUp;
  const ms = await waitReady(standby.base, t0);
  const result = startOf(standby, ms);
  await stop(standby);
  return result;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? NaN;
const steps = (s: Start) =>
  Object.entries(s.rebuildMs)
    .filter(([, v]) => v >= 20)
    .map(([k, v]) => `${k.replace(/Ms$/, '')} ${v}`)
    .join(', ');

async function main(): Promise<void> {
  const bigDir = mkdtempSync(join(tmpdir(), 'pdctl-startup-'));
  const emptyDir = mkdtempSync(join(tmpdir(), 'pdctl-startup-empty-'));
  try {
    if (URL && FILLED) say(`starting on ${URL.replace(/:[^:@/]*@/, ':***@')} as it is`);
    else if (URL) {
      say(
        `filling ${URL.replace(/:[^:@/]*@/, ':***@')} with ${ROOMS} rooms (pdctl journal synth)…`,
      );
      execFileSync(
        process.execPath,
        [BIN, 'journal', 'synth', '--rooms', String(ROOMS), '--span', '24h', '--journal', URL],
        {
          stdio: ['ignore', 'ignore', 'inherit'],
        },
      );
    } else if (JOURNAL) {
      say(`copying ${JOURNAL}…`);
      copyFileSync(JOURNAL, join(bigDir, 'journal.db'));
      if (existsSync(`${JOURNAL}-wal`))
        copyFileSync(`${JOURNAL}-wal`, join(bigDir, 'journal.db-wal'));
    } else {
      say(`writing ${ROOMS} synthetic rooms (pdctl journal synth, durability process)…`);
      execFileSync(
        process.execPath,
        [
          BIN,
          'journal',
          'synth',
          '--rooms',
          String(ROOMS),
          '--span',
          '24h',
          '--durability',
          'process',
          '--journal',
          join(bigDir, 'journal.db'),
        ],
        { stdio: ['ignore', 'ignore', 'inherit'] },
      );
    }
    const bigUrl = URL;
    const rows: Array<{ run: string; round: number } & Start> = [];
    const show = (run: string, round: number, s: Start) => {
      rows.push({ run, round, ...s });
      const from =
        s.checkpointSeq === null ? 'no checkpoint' : `checkpoint at seq ${s.checkpointSeq}`;
      say(
        `| ${round} | ${run} | ${s.ms.toFixed(0)} | ${from}, ${s.foldedEvents} events folded | ${steps(s)} |`,
      );
    };
    say('| round | start | ms to ready | state from | steps ≥ 20 ms |');
    say('|---:|---|---:|---|---|');
    show('big journal, first start', 0, await start(bigDir, bigUrl, 'kill'));
    for (let round = 1; round <= ROUNDS; round++) {
      rmSync(emptyDir, { recursive: true, force: true });
      // On PostgreSQL the empty journal is a new database on the same server.
      const emptyUrl = URL
        ? (await drillPostgres(URL, `pdctl_startup_empty_${process.pid}_${round}`)).url
        : '';
      show('empty journal', round, await start(emptyDir, emptyUrl, 'stop'));
      show('big journal, after SIGKILL', round, await start(bigDir, bigUrl, 'kill'));
    }
    if (URL && FAILOVER) {
      for (let round = 1; round <= ROUNDS; round++) {
        const emptyUrl = (await drillPostgres(URL, `pdctl_failover_empty_${process.pid}_${round}`))
          .url;
        show('failover, empty journal', round, await failover(emptyUrl, emptyDir));
        show('failover, big journal', round, await failover(bigUrl, bigDir));
      }
    }
    const msOf = (run: string) => rows.filter((r) => r.run === run).map((r) => r.ms);
    const empty = median(msOf('empty journal'));
    const big = median(msOf('big journal, after SIGKILL'));
    const bytes = URL ? null : journalBytes(bigDir);
    // A journal given (--journal) holds the rooms it holds: count them rather than say --rooms.
    const rooms = JOURNAL && !URL ? countRooms(join(bigDir, 'journal.db')) : ROOMS;
    const summary = {
      rooms,
      journalBytes: bytes,
      emptyMs: Math.round(empty),
      restartMs: Math.round(big),
      overEmptyMs: Math.round(big - empty),
      firstStartMs: Math.round(rows[0]?.ms ?? NaN),
      failoverEmptyMs: Math.round(median(msOf('failover, empty journal'))),
      failoverBigMs: Math.round(median(msOf('failover, big journal'))),
      rows,
    };
    say(
      `\nmedian of ${ROUNDS}: empty ${summary.emptyMs} ms, after SIGKILL on ${rooms} rooms${bytes ? ` (${(bytes / 1e9).toFixed(2)} GB)` : ''} ${summary.restartMs} ms: ${summary.overEmptyMs} ms over empty; the first start (no checkpoint) took ${summary.firstStartMs} ms`,
    );
    if (FAILOVER)
      say(
        `failover, leader's SIGKILL to the standby's /health/ready: ${summary.failoverEmptyMs} ms on an empty journal, ${summary.failoverBigMs} ms on the big one`,
      );
    if (asJson) process.stdout.write(`${JSON.stringify(summary)}\n`);
  } finally {
    rmSync(bigDir, { recursive: true, force: true });
    rmSync(emptyDir, { recursive: true, force: true });
  }
}

await main();

/** The rooms a SQLite journal holds, read-only. */
function countRooms(path: string): number {
  const db = new Database(path, { readonly: true });
  try {
    return db.prepare('SELECT count(*) FROM rooms').pluck().get() as number;
  } finally {
    db.close();
  }
}
