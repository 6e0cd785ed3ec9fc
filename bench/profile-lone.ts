/**
 * Where a lone room's time goes on each thread: V8's sampling profiles (every 100 µs) of the
 * control plane — its main thread and the journal's writer thread — and of both engine processes,
 * over rooms run one at a time, each thread's samples grouped by what they ran (ZeroMQ, msgpack,
 * the journal, the engine's reaction, timers, GC, …) and divided by the rooms. A sample is taken
 * whenever the thread is not idle in its event loop: running, or blocked inside a synchronous call
 * (the writer's fsync is counted there, though it burns no CPU). The profiles cover only the
 * rooms' window (warm-up and shutdown left out).
 *
 *   npm run bench:profile                      # a table (near-zero compute, journal at power)
 *   npm run bench:profile -- --rooms 2000 --durability process --keep /tmp/profiles
 *
 * It re-runs itself under `node --cpu-prof` so that the writer thread is profiled as well; the
 * engines it spawns run with the same flags. docs/critical-path.md has a run.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startStack } from '../src/app/stack.ts';
import type { Durability } from '../src/journal/store.ts';
import { silentLogger } from '../src/log.ts';
import { argv, asJson, checkFlags, flag, say } from './args.ts';

const ROOMS = Number(flag('--rooms', '1000'));
const DURABILITY = flag('--durability', 'power') as Durability;
const KEEP = flag('--keep', '');
/** Also list each process's `--top N` functions by time (default 0: none). */
const TOP = Number(flag('--top', '0'));
checkFlags();
const INTERVAL_US = 100;

/** Where the profiles go, and the window of the rooms (monotonic µs), once measured. */
interface Run {
  dir: string;
  fromUs: number;
  toUs: number;
  rooms: number;
  wallMs: number;
  /** The profiled run's process: its main thread is the control plane's. */
  pid: number;
}

if (process.env.PDCTL_PROFILE_DIR === undefined) {
  // The parent: runs this file again under --cpu-prof, then reads what it wrote.
  const dir = KEEP || mkdtempSync(join(tmpdir(), 'pdctl-profile-'));
  mkdirSync(dir, { recursive: true });
  const child = spawnSync(
    process.execPath,
    [
      '--import',
      'tsx',
      '--cpu-prof',
      `--cpu-prof-dir=${dir}`,
      `--cpu-prof-interval=${INTERVAL_US}`,
      process.argv[1] as string,
      ...argv,
    ],
    { env: { ...process.env, PDCTL_PROFILE_DIR: dir }, stdio: ['ignore', 'pipe', 'inherit'] },
  );
  if (child.status !== 0) {
    process.stderr.write(`bench:profile: the profiled run failed (exit ${child.status})\n`);
    process.exit(1);
  }
  const run = JSON.parse(child.stdout.toString()) as Run;
  report(run);
  if (!KEEP) rmSync(dir, { recursive: true, force: true });
} else {
  const run = await profiledRooms(process.env.PDCTL_PROFILE_DIR);
  process.stdout.write(JSON.stringify(run));
}

/** Runs the stack and the lone rooms; the profiles are written when each process exits. */
async function profiledRooms(dir: string): Promise<Run> {
  say(`profiles in ${dir}`);
  const journalDir = mkdtempSync(join(tmpdir(), 'pdctl-profile-journal-'));
  const stack = await startStack({
    journalPath: join(journalDir, 'journal.db'),
    durability: DURABILITY,
    log: silentLogger,
    version: 'bench',
    engineLogLevel: 'error',
    // The engines run with this process's flags (recovery/self.ts), --cpu-prof included.
    engineArgs: ['--prefill-us-per-token', '0', '--decode-us-per-token', '0'],
  });
  try {
    const { control } = stack;
    const prompt = (i: number) => `the lone room number ${i} walks north along the river`;
    for (let i = 0; i < 200; i++) await control.submit({ prompt: prompt(i), maxTokens: 16 }).result;
    say(`profiling ${ROOMS} lone rooms…`);
    const fromUs = Number(process.hrtime.bigint() / 1000n);
    const t0 = performance.now();
    for (let i = 0; i < ROOMS; i++)
      await control.submit({ prompt: prompt(1000 + i), maxTokens: 16 }).result;
    const wallMs = performance.now() - t0;
    const toUs = Number(process.hrtime.bigint() / 1000n);
    return { dir, fromUs, toUs, rooms: ROOMS, wallMs, pid: process.pid };
  } finally {
    await stack.stop();
    rmSync(journalDir, { recursive: true, force: true });
  }
}

interface CpuProfile {
  nodes: Array<{
    id: number;
    callFrame: { functionName: string; url: string };
  }>;
  startTime: number;
  samples: number[];
  timeDeltas: number[];
}

/** What a sample ran, by its function and script. */
function category(functionName: string, url: string): string | null {
  if (functionName === '(idle)') return null;
  if (functionName === '(garbage collector)') return 'GC';
  if (functionName === '(program)') return 'V8 and native, unattributed';
  const rules: Array<[RegExp, string]> = [
    [/node_modules\/zeromq/, 'ZeroMQ send and receive'],
    [/node_modules\/msgpackr/, 'encoding and decoding (msgpack)'],
    [
      /node_modules\/better-sqlite3|src\/journal\/sqlite\/(writer|batch)/,
      'journal writer: SQLite commit',
    ],
    [/src\/journal\//, 'journal: validation, fold, hand-off'],
    [/node_modules\/@sinclair\/typebox/, 'schema checks (typebox)'],
    [/node_modules\/pino/, 'logging'],
    [/src\/bus\//, 'bus: framing, outbox, quotas'],
    [/src\/control\//, 'control plane: rooms, relays, routing'],
    [/src\/engine\//, 'engine: its reaction'],
    [/src\/transfer\//, 'transfer core (JS side)'],
    [/src\/model\//, 'model'],
    [/node:internal\/timers|^timers$/, 'timers and wake-ups'],
    [/node:internal\/process\/task_queues|node:internal\/async_hooks/, 'promise and tick queues'],
    [
      /node:internal\/worker|node:internal\/per_context\/messageport/,
      'thread hand-off (MessagePort)',
    ],
    [/^node:/, 'other Node internals'],
  ];
  for (const [re, name] of rules) if (re.test(url)) return name;
  if (url === '') return 'V8 builtins and native calls';
  return 'other';
}

/** Time by category of one profile in [fromUs, toUs]; `fns` gathers it by function too. */
function summarize(
  p: CpuProfile,
  fromUs: number,
  toUs: number,
  fns: Map<string, number>,
): Map<string, number> {
  const byId = new Map(p.nodes.map((n) => [n.id, n.callFrame]));
  const out = new Map<string, number>();
  let t = p.startTime;
  for (let i = 0; i < p.samples.length; i++) {
    const delta = p.timeDeltas[i] ?? 0;
    t += delta;
    if (t < fromUs || t > toUs) continue;
    const f = byId.get(p.samples[i] as number);
    if (!f) continue;
    const c = category(f.functionName, f.url);
    if (c === null) continue;
    out.set(c, (out.get(c) ?? 0) + delta / 1000);
    const fn = `${f.functionName || '(anonymous)'} ${f.url.replace(/^.*\/(src|node_modules)\//, '$1/')}`;
    fns.set(fn, (fns.get(fn) ?? 0) + delta / 1000);
  }
  return out;
}

/**
 * Which process and thread a profile is: the bench's main thread (the control plane) or another
 * of its threads (the journal's writer), or an engine — a prefill engine's ran the prefill path.
 */
function processOf(file: string, profile: CpuProfile, benchPid: number): string {
  const [, pid, tid] = /^CPU\.\d+\.\d+\.(\d+)\.(\d+)\./.exec(file) ?? [];
  if (Number(pid) === benchPid)
    return Number(tid) === 0 ? 'control plane' : 'journal writer thread';
  const prefill = profile.nodes.some(
    (n) => /src\/engine\/prefill\.ts$/.test(n.callFrame.url) && n.callFrame.functionName === 'run',
  );
  return prefill ? 'prefill engine' : 'decode engine';
}

function report(run: Run): void {
  const files = readdirSync(run.dir).filter((f) => f.endsWith('.cpuprofile'));
  const columns = new Map<string, Map<string, number>>();
  const functions = new Map<string, Map<string, number>>();
  for (const f of files) {
    const profile = JSON.parse(readFileSync(join(run.dir, f), 'utf8')) as CpuProfile;
    const name = processOf(f, profile, run.pid);
    const fns = functions.get(name) ?? new Map<string, number>();
    functions.set(name, fns);
    const sum = summarize(profile, run.fromUs, run.toUs, fns);
    const col = columns.get(name) ?? new Map<string, number>();
    for (const [c, ms] of sum) col.set(c, (col.get(c) ?? 0) + ms);
    columns.set(name, col);
  }
  const order = ['control plane', 'journal writer thread', 'prefill engine', 'decode engine'];
  const names = [...columns.keys()].sort((a, b) => order.indexOf(a) - order.indexOf(b));
  const cats = new Map<string, number>();
  for (const col of columns.values())
    for (const [c, ms] of col) cats.set(c, (cats.get(c) ?? 0) + ms);
  const rows = [...cats].sort((a, b) => b[1] - a[1]).map(([c]) => c);
  const per = (ms: number) => Math.round((ms / run.rooms) * 1000) / 1000;
  const totals = names.map((n) => [...(columns.get(n)?.values() ?? [])].reduce((a, b) => a + b, 0));
  if (asJson) {
    process.stdout.write(
      `${JSON.stringify(
        {
          bench: 'profile-lone',
          rooms: run.rooms,
          durability: DURABILITY,
          wallMsPerRoom: per(run.wallMs),
          busyMsPerRoom: Object.fromEntries(
            names.map((n) => [
              n,
              Object.fromEntries([...(columns.get(n) ?? [])].map(([c, ms]) => [c, per(ms)])),
            ]),
          ),
        },
        null,
        2,
      )}\n`,
    );
    return;
  }
  const out = [
    `pdctl lone-room profile — ${run.rooms} rooms one at a time, near-zero compute, journal at ${DURABILITY}; V8 samples every ${INTERVAL_US} µs of each thread not idle in its event loop (running, or blocked in a synchronous call such as fsync).`,
    `Wall per room: ${per(run.wallMs)} ms. Busy thread time per room, all threads: ${per(totals.reduce((a, b) => a + b, 0))} ms.`,
    '',
    `| ms per room | ${names.join(' | ')} | all |`,
    `|---|${names.map(() => '--:').join('|')}|--:|`,
    ...rows.map(
      (c) =>
        `| ${c} | ${names.map((n) => per(columns.get(n)?.get(c) ?? 0)).join(' | ')} | ${per(cats.get(c) ?? 0)} |`,
    ),
    `| **total** | ${totals.map(per).join(' | ')} | ${per(totals.reduce((a, b) => a + b, 0))} |`,
  ];
  for (const n of TOP > 0 ? names : []) {
    const top = [...(functions.get(n) ?? [])].sort((a, b) => b[1] - a[1]).slice(0, TOP);
    out.push('', `${n}, top ${TOP} functions (ms per room):`);
    for (const [fn, ms] of top) out.push(`  ${per(ms).toFixed(3)}  ${fn}`);
  }
  process.stdout.write(`${out.join('\n')}\n`);
}
