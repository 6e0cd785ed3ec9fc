/**
 * A soak anyone can run: `pdctl serve` (a real process, its engines, the built-in model) under
 * closed-loop HTTP load for N minutes. Each minute it prints rooms/s, latency p50/p99, the RSS of
 * every process and the journal's bytes on disk; at the end it kills the control plane (SIGKILL
 * of its whole process group, as a host crash would) and times its restart on the same data
 * directory against a start on an empty journal, measured in the same run.
 *
 *   npm run soak:serve -- --minutes 60 --retain 5m          # what docs/benchmarks.md shows
 *   npm run soak:serve -- --minutes 2 --clients 16 --max-tokens 8 --keep
 *
 * Flags: --minutes N (default 10), --clients C (16), --retain D (passed to serve; default none),
 * --max-tokens T (8), --keep (leave the data directory), --json (one object at the end),
 * --postgres ADMIN_URL (the journal in a new database on that server, and the empty start's in
 * another: `journal MB` is then its tables' and indexes' bytes).
 */
import { fork } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { checkFlags, flag, has } from '../bench/args.ts';
import type { ClientJob, ClientResult } from '../bench/serve-client.ts';
import { journalBytes, killGroup, type Server, stop, timedStart } from '../bench/serve-process.ts';
import { createDatabase } from '../src/journal/postgres/cluster.ts';
import { PgReader } from '../src/journal/postgres/reader.ts';

const MINUTES = Number(flag('--minutes', '10'));
const CLIENTS = Number(flag('--clients', '16'));
const RETAIN = flag('--retain', '');
const MAX_TOKENS = Number(flag('--max-tokens', '8'));
const KEEP = has('--keep');
const JSON_OUT = has('--json');
const POSTGRES = flag('--postgres', '');
checkFlags();
for (const [name, v] of [
  ['--minutes', MINUTES],
  ['--clients', CLIENTS],
  ['--max-tokens', MAX_TOKENS],
] as const) {
  if (!Number.isInteger(v) || v < 1) {
    process.stderr.write(`soak:serve: ${name} must be a positive integer\n`);
    process.exit(2);
  }
}

const say = (s: string) => process.stderr.write(`${s}\n`);
const serveArgs = RETAIN ? ['--retain', RETAIN] : [];
/** On PostgreSQL: the run's journal and the empty start's, each a new database. */
const pgUrls = POSTGRES
  ? {
      run: await createDatabase(POSTGRES, `pdctl_soak_${Date.now()}`),
      empty: await createDatabase(POSTGRES, `pdctl_soak_empty_${Date.now()}`),
    }
  : null;
if (pgUrls) serveArgs.push('--journal', pgUrls.run);
const pgReader = pgUrls ? new PgReader(pgUrls.run) : null;

/** The journal's bytes: the file's, or the PostgreSQL tables' and indexes'. */
async function bytesOf(dir: string): Promise<number> {
  return pgReader ? (await pgReader.diskUsage()).bytes : journalBytes(dir);
}

function rssMb(pid: number): number | null {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Math.round(Number(m[1]) / 1024) : null;
  } catch {
    return null;
  }
}

async function engines(base: string): Promise<Array<{ id: string; pid: number }>> {
  const r = (await (await fetch(`${base}/v1/engines`)).json()) as {
    engines: Array<{ id: string; pid: number }>;
  };
  return r.engines;
}

async function pruned(base: string): Promise<number> {
  const r = await fetch(`${base}/v1/admin/journal/prune`);
  if (r.status !== 200) return 0;
  return ((await r.json()) as { totals: { rooms: number } }).totals.rooms;
}

interface Minute {
  minute: number;
  roomsPerSec: number;
  p50Ms: number;
  p99Ms: number;
  failed: number;
  rssMb: Record<string, number | null>;
  journalMb: number;
  prunedRooms: number;
}

const pct = (sorted: number[], p: number) =>
  sorted.length
    ? (sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number)
    : Number.NaN;

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'pdctl-soak-'));
  const emptyDir = mkdtempSync(join(tmpdir(), 'pdctl-soak-empty-'));
  let server: Server | null = null;
  const client = fork(resolve(import.meta.dirname, '../bench/serve-client.ts'), [], {
    execArgv: ['--import', 'tsx'],
  });
  try {
    say(
      `soak:serve: ${MINUTES} min, ${CLIENTS} clients, ${MAX_TOKENS}-token completions, retain ${RETAIN || 'everything'}; data in ${dir}${pgUrls ? `, journal ${pgUrls.run.replace(/:[^:@/]*@/, ':***@')}` : ''}`,
    );
    server = (await timedStart(dir, serveArgs)).server;
    const minutes: Minute[] = [];
    say(
      '| minute | rooms/s | p50 ms | p99 ms | failed | RSS MB (control, engines) | journal MB | pruned rooms |',
    );
    say('|---:|---:|---:|---:|---:|---|---:|---:|');
    for (let m = 1; m <= MINUTES; m++) {
      const job: ClientJob = {
        base: server.base,
        model: 'pdctl-deterministic-1',
        connections: CLIENTS,
        seconds: 60,
        maxTokens: MAX_TOKENS,
        mode: 'complete',
        promptWords: 40,
      };
      const result = await new Promise<ClientResult>((ok) => {
        client.once('message', (r) => ok(r as ClientResult));
        client.send(job);
      });
      const rss: Record<string, number | null> = { control: rssMb(server.proc.pid as number) };
      for (const e of await engines(server.base)) rss[e.id] = rssMb(e.pid);
      const row: Minute = {
        minute: m,
        roomsPerSec: Math.round(result.rps),
        p50Ms: Number(pct(result.ms, 50).toFixed(1)),
        p99Ms: Number(pct(result.ms, 99).toFixed(1)),
        failed: result.errors,
        rssMb: rss,
        journalMb: Number(((await bytesOf(dir)) / 1e6).toFixed(1)),
        prunedRooms: await pruned(server.base),
      };
      minutes.push(row);
      const rssText = Object.values(rss)
        .map((v) => v ?? '-')
        .join(', ');
      say(
        `| ${m} | ${row.roomsPerSec} | ${row.p50Ms} | ${row.p99Ms} | ${row.failed} | ${rssText} | ${row.journalMb} | ${row.prunedRooms} |`,
      );
      if (result.firstError) say(`  first error this minute: ${result.firstError}`);
    }
    say('killing the control plane and its engines (SIGKILL of the process group)…');
    await killGroup(server);
    server = null;
    const restart = await timedStart(dir, serveArgs);
    server = restart.server;
    const bytes = await bytesOf(dir);
    await stop(server);
    server = null;
    const empty = await timedStart(emptyDir, pgUrls ? ['--journal', pgUrls.empty] : []);
    await stop(empty.server);
    const summary = {
      minutes,
      restartMs: Math.round(restart.ms),
      emptyStartMs: Math.round(empty.ms),
      journalBytes: bytes,
    };
    say(
      `restart after SIGKILL: ${(restart.ms / 1000).toFixed(2)} s to /health/ready on ${(bytes / 1e6).toFixed(1)} MB of journal; a start on an empty journal, same run: ${(empty.ms / 1000).toFixed(2)} s`,
    );
    if (JSON_OUT) process.stdout.write(`${JSON.stringify(summary)}\n`);
  } finally {
    client.disconnect();
    pgReader?.close();
    if (server) await killGroup(server).catch(() => {});
    rmSync(emptyDir, { recursive: true, force: true });
    if (KEEP) say(`kept ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

await main();
