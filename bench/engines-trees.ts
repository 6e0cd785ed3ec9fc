/**
 * `npm run bench:engines -- --lone --tree DIR`: a before/after of a change to a lone room's path,
 * in one run. `pdctl serve` of this checkout and of each `--tree DIR` (an older commit, say, in a
 * git worktree with its node_modules and native build) run side by side on loopback, each with its
 * prefill and decode engine and the built-in model's near-zero compute; lone rooms go over HTTP
 * to one stack at a time, in rounds, each stack first in turn — so the machine's drift (up to 2×
 * within a day here) falls on every tree alike, and a difference of a few tenths of a millisecond
 * shows through it.
 *
 * Per tree: added p50 and p99 over every room, the median of the rounds' p50s, and the machine's
 * CPU per room (every process: both stacks, this client; the stack not driven sits idle); then,
 * against the first tree (this checkout), in how many rounds its p50 was lower and the median of
 * the rounds' differences. Flags: `--rooms N` per round (100), `--rounds N` (12), `--durability
 * process|power` (power), `--json`.
 */
import type { ChildProcess } from 'node:child_process';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { until } from '../src/drills/poll.ts';
import { freePort } from '../src/net.ts';
import {
  argv,
  asJson,
  checkFlags,
  flag,
  has,
  machineCpuMs,
  medianBucket,
  percentile,
  say,
} from './args.ts';
import {
  commitDepths,
  emptySample,
  loneRooms,
  MAX_TOKENS,
  PROMPT_WORDS,
  readBack,
  type Sample,
  sendLone,
  stepMeans,
  stepsTable,
} from './lone-http.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const ROOMS = Number(flag('--rooms', '100'));
const ROUNDS = Number(flag('--rounds', '12'));
const DURABILITY = flag('--durability', 'power');
has('--lone');
flag('--tree', ''); // read below, every one given
const TREES = [ROOT, ...argv.flatMap((a, i) => (argv[i - 1] === '--tree' ? [resolve(a)] : []))];
checkFlags();
for (const [name, n] of [
  ['--rooms', ROOMS],
  ['--rounds', ROUNDS],
] as const) {
  if (!Number.isInteger(n) || n < 1) {
    process.stderr.write(`bench:engines: ${name} takes a whole number ≥ 1, got ${n}\n`);
    process.exit(2);
  }
}
for (const tree of TREES) {
  const missing = ['src/cli/bin.ts', 'node_modules', 'native/build'].filter(
    (part) => !existsSync(join(tree, part)),
  );
  if (missing.length > 0) {
    process.stderr.write(
      `bench:engines: --tree ${tree} is not a checkout ready to run (no ${missing.join(', ')}): make one with git worktree add, link node_modules and copy native/build into it\n`,
    );
    process.exit(2);
  }
}
if (DURABILITY !== 'power' && DURABILITY !== 'process') {
  process.stderr.write(`bench:engines: --durability is power or process, got ${DURABILITY}\n`);
  process.exit(2);
}

interface Stack {
  tree: string;
  base: string;
  proc: ChildProcess;
  data: string;
}

interface Row {
  tree: string;
  rooms: number;
  failed: number;
  addedMsP50: number;
  addedMsP99: number;
  /** The median of the rounds' added p50s. */
  roundP50Median: number;
  cpuMsPerRoom: number;
  /** Against the first tree: rounds where this tree's p50 was lower, and the median difference. */
  lowerRounds: number | null;
  roundDiffMsMedian: number | null;
  commitsP50: number | null;
  stepsMeanMs: Record<string, number>;
}

const stacks: Stack[] = [];
const cleanup = () => {
  for (const s of stacks) {
    s.proc.kill('SIGKILL');
    rmSync(s.data, { recursive: true, force: true });
  }
};
process.once('SIGINT', () => {
  cleanup();
  process.exit(130);
});

/** `pdctl serve` of `tree` on loopback, with its own journal and its prefill and decode engine. */
async function startStack(tree: string): Promise<Stack> {
  const data = mkdtempSync(join(tmpdir(), 'pdctl-bench-trees-'));
  const [http, bus] = [await freePort(), await freePort()];
  const proc = spawn(
    process.execPath,
    [
      ...['--import', 'tsx', 'src/cli/bin.ts', 'serve'],
      ...['--host', '127.0.0.1', '--port', String(http), '--bus', `tcp://127.0.0.1:${bus}`],
      ...['--data-dir', data, '--durability', DURABILITY, '--log-level', 'warn'],
    ],
    { cwd: tree, stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  proc.stderr?.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-2000);
  });
  const stack = { tree, base: `http://127.0.0.1:${http}`, proc, data };
  stacks.push(stack);
  const up = await until(
    async () => {
      if (proc.exitCode !== null) return true;
      const res = await fetch(`${stack.base}/v1/engines`).catch(() => null);
      if (!res?.ok) return false;
      const { engines } = (await res.json()) as { engines: Array<{ state: string }> };
      return engines.filter((e) => e.state === 'ready').length === 2;
    },
    60_000,
    200,
  );
  if (!up || proc.exitCode !== null) {
    throw new Error(
      `pdctl serve of ${tree} ${proc.exitCode !== null ? `exited (${proc.exitCode})` : 'had no two engines ready within a minute'}; its last words: ${stderr.trim() || '(none)'}`,
    );
  }
  return stack;
}

const median = (xs: readonly number[]) =>
  percentile(
    [...xs].sort((a, b) => a - b),
    50,
  );
const r2 = (x: number) => Number(x.toFixed(2));
const r3 = (x: number) => Number(x.toFixed(3));

try {
  for (const tree of TREES) {
    say(`starting pdctl serve of ${tree} (durability ${DURABILITY}) …`);
    await startStack(tree);
  }
  const samples = stacks.map(emptySample);
  for (const [n, s] of stacks.entries()) await loneRooms(s.base, 30, 10_000, samples[n] as Sample); // warm-up
  for (const sample of samples) {
    sample.addedMs = [];
    sample.steps.clear();
  }
  const roundP50s = stacks.map(() => [] as number[]);
  const cpuMs = stacks.map(() => 0);
  for (let round = 0; round < ROUNDS; round++) {
    // Interleaved, each stack first in turn: the machine's drift falls on all alike.
    const order = stacks.map((_, i) => (i + round) % stacks.length);
    for (const n of order) {
      const sample = emptySample();
      const base = (stacks[n] as Stack).base;
      const cpu0 = machineCpuMs();
      const answered = await sendLone(base, ROOMS, round * ROOMS, sample);
      cpuMs[n] = (cpuMs[n] as number) + machineCpuMs() - cpu0;
      await readBack(base, answered, sample);
      const into = samples[n] as Sample;
      into.addedMs.push(...sample.addedMs);
      into.failed += sample.failed;
      for (const [k, v] of sample.steps) {
        const step = into.steps.get(k) ?? { ms: 0, rooms: 0 };
        step.ms += v.ms;
        step.rooms += v.rooms;
        into.steps.set(k, step);
      }
      (roundP50s[n] as number[]).push(median(sample.addedMs));
    }
    say(
      `round ${round + 1}/${ROUNDS}: added p50 ${roundP50s.map((p) => (p.at(-1) as number).toFixed(2)).join(' / ')} ms`,
    );
  }
  const first = roundP50s[0] as number[];
  const rows: Row[] = [];
  for (const [n, s] of stacks.entries()) {
    const sample = samples[n] as Sample;
    const ms = [...sample.addedMs].sort((a, b) => a - b);
    const mine = roundP50s[n] as number[];
    const against = n === 0 ? null : mine.map((p, i) => p - (first[i] as number));
    rows.push({
      tree: s.tree,
      rooms: ms.length,
      failed: sample.failed,
      addedMsP50: r2(percentile(ms, 50)),
      addedMsP99: r2(percentile(ms, 99)),
      roundP50Median: r2(median(mine)),
      cpuMsPerRoom: r2((cpuMs[n] as number) / Math.max(1, ms.length + sample.failed)),
      lowerRounds: against ? against.filter((d) => d < 0).length : null,
      roundDiffMsMedian: against ? r3(median(against)) : null,
      commitsP50: medianBucket(await commitDepths(s.base)),
      stepsMeanMs: stepMeans(sample),
    });
  }
  if (asJson) {
    process.stdout.write(
      `${JSON.stringify({ bench: 'engines-trees', cores: cpus().length, node: process.version, durability: DURABILITY, rounds: ROUNDS, roomsPerRound: ROOMS, promptWords: PROMPT_WORDS, maxTokens: MAX_TOKENS, rows }, null, 2)}\n`,
    );
  } else {
    const lines = [
      `pdctl lone rooms, trees side by side — ${cpus().length} cores, node ${process.version}, durability ${DURABILITY};`,
      `pdctl serve on loopback with 1 prefill + 1 decode engine, near-zero compute, prompt ${PROMPT_WORDS} words, ${MAX_TOKENS} tokens out;`,
      `${ROUNDS} rounds of ${ROOMS} lone rooms per tree, interleaved.`,
      '',
      '| tree | rooms | failed | added p50 ms | added p99 ms | median of round p50s | CPU ms/room | rounds lower than the first | median round difference ms | commits p50 |',
      '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
      ...rows.map(
        (r) =>
          `| ${r.tree} | ${r.rooms} | ${r.failed} | ${r.addedMsP50} | ${r.addedMsP99} | ${r.roundP50Median} | ${r.cpuMsPerRoom} | ${r.lowerRounds === null ? '–' : `${r.lowerRounds} of ${ROUNDS}`} | ${r.roundDiffMsMedian ?? '–'} | ${r.commitsP50 ?? '-'} |`,
      ),
      '',
      'added = the request as this client saw it (HTTP included) minus the compute the engines journaled.',
      "CPU ms/room: the whole machine over the tree's requests (every process), per room; reading the journal back after each round is left out.",
      "A round difference is that round's p50 minus the first tree's in the same round: negative is faster.",
      '',
      'Mean ms between events, from the journal (whole-ms timestamps):',
      '',
      ...stepsTable(rows),
    ];
    process.stdout.write(`${lines.join('\n')}\n`);
  }
} finally {
  cleanup();
}
