/**
 * `npm run bench:engines -- --hosts`: a lone room across test hosts (network namespaces, each with
 * its own /dev/shm; src/drills/hosts.ts) — `pdctl serve` on host c, a prefill engine on host a, a
 * decode engine on host b, the KV moved by UCX over TCP — one request at a time over HTTP, with the
 * built-in model's near-zero compute. Against, in the same run: the floor of a two-commit path
 * (two ZeroMQ round trips between hosts a and c, measured there, and two one-event commits of the
 * journal writer inline at `power`).
 *
 * `--tree DIR` (repeatable) also runs the stack of another checkout — an older commit, say, with
 * its node_modules and native build — beside this one's, the rounds interleaved: a before/after of
 * the same path on the same hosts in one run. Flags: `--rooms N` per round (100), `--rounds N` (4),
 * `--json`. Needs root, `ip`, and UCX.
 */
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { newKeyPair } from '../src/bus/admission.ts';
import { TestHosts, testHostsUnavailable } from '../src/drills/hosts.ts';
import { until } from '../src/drills/poll.ts';
import { ucxBackend } from '../src/transfer/ucx.ts';
import { argv, asJson, checkFlags, flag, medianBucket, percentile, say } from './args.ts';
import { ECHO } from './bus-echo.ts';
import { inlineWriter } from './inline-writer.ts';
import {
  asOperator,
  commitDepths,
  emptySample,
  loneRooms,
  MAX_TOKENS,
  PROMPT_WORDS,
  type Sample,
  stepMeans,
  stepsTable,
} from './lone-http.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const ROOMS = Number(flag('--rooms', '100'));
const ROUNDS = Number(flag('--rounds', '4'));
flag('--tree', ''); // read below, every one given
const TREES = [ROOT, ...argv.flatMap((a, i) => (argv[i - 1] === '--tree' ? [resolve(a)] : []))];
checkFlags();

/** A ROUTER on host c timing round trips to the echo on host a (argv: zeromq, endpoint, count). */
const PING = `const zmq = require(process.argv[1]);
(async () => {
  const r = new zmq.Router({ linger: 0 });
  await r.bind(process.argv[2]);
  const [peer] = await r.receive();
  const ms = [];
  for (let i = 0; i < 50 + Number(process.argv[3]); i++) {
    const t = performance.now();
    await r.send([peer, 'ping']);
    await r.receive();
    if (i >= 50) ms.push(performance.now() - t);
    await new Promise((s) => setTimeout(s, 1));
  }
  ms.sort((a, b) => a - b);
  process.stdout.write(JSON.stringify({ p50Ms: ms[Math.floor(ms.length / 2)] }));
  r.close();
})();`;

interface Stack {
  tree: string;
  base: string;
  procs: ChildProcess[];
  data: string;
}

interface Row {
  tree: string;
  rooms: number;
  failed: number;
  addedMsP50: number;
  addedMsP99: number;
  inFloors: number;
  commitsP50: number | null;
  stepsMeanMs: Record<string, number>;
}

const why = testHostsUnavailable() ?? (ucxBackend().available ? null : ucxBackend().reason);
if (why) {
  process.stderr.write(`bench:engines --hosts needs test hosts and UCX: ${why}\n`);
  process.exit(1);
}
say('making test hosts a, b and c (network namespaces with their own /dev/shm)');
const hosts = await TestHosts.create({ names: ['a', 'b', 'c'], reach: ['c'] });
const stacks: Stack[] = [];
const cleanup = () => {
  for (const s of stacks) for (const p of s.procs) p.kill('SIGKILL');
  hosts.destroy();
  for (const s of stacks) rmSync(s.data, { recursive: true, force: true });
};
process.once('SIGINT', () => {
  cleanup();
  process.exit(130);
});

/** `pdctl` from a checkout, on a test host. */
/** The serves' admin token: this process sends it too, to their query routes (lone-http.ts). */
const ADMIN_TOKEN = 'bench-hosts';
process.env.PDCTL_ADMIN_TOKEN = ADMIN_TOKEN;

function pdctl(tree: string, host: string, args: string[], env: NodeJS.ProcessEnv): ChildProcess {
  const child = hosts.spawn(
    host,
    process.execPath,
    ['--import', 'tsx', 'src/cli/bin.ts', ...args],
    {
      cwd: tree,
      env: { ...process.env, ...env },
    },
  );
  child.stdout?.resume();
  child.stderr?.resume();
  return child;
}

/** Waits until `ok` holds, or throws naming `what` after a minute. */
async function ready(what: string, ok: () => Promise<boolean>): Promise<void> {
  if (!(await until(() => ok().catch(() => false), 60_000, 200)))
    throw new Error(`timed out waiting for ${what}`);
}

/** One stack of `tree`: serve on c, its prefill engine on a, its decode engine on b. */
async function startStack(tree: string, n: number): Promise<Stack> {
  const data = mkdtempSync(join(tmpdir(), 'pdctl-bench-hosts-'));
  const server = newKeyPair();
  writeFileSync(join(data, 'bus.key'), JSON.stringify(server), { mode: 0o600 });
  const ids = { prefill: `prefill-a${n}`, decode: `decode-b${n}` };
  const keys = { prefill: newKeyPair(), decode: newKeyPair() };
  const [http, bus] = [18180 + n, 15650 + n];
  const procs = [
    pdctl(
      tree,
      'c',
      [
        'serve',
        ...['--host', '0.0.0.0', '--port', String(http), '--bus', `tcp://0.0.0.0:${bus}`],
        ...['--prefill', '0', '--decode', '0', '--data-dir', data, '--log-level', 'warn'],
        ...['--engine-key', `${ids.prefill}=${keys.prefill.publicKey}`],
        ...['--engine-key', `${ids.decode}=${keys.decode.publicKey}`],
      ],
      // Served on the test hosts' network with no tenant: an admin token keeps it from being open
      // (which serve refuses), in every tree alike (older ones have no --allow-open).
      { PDCTL_ADMIN_TOKEN: ADMIN_TOKEN },
    ),
  ];
  const base = `http://${hosts.address('c', 'self')}:${http}`;
  await ready(`pdctl serve of ${tree}`, async () => (await fetch(`${base}/health`)).ok);
  for (const [role, host, peer] of [
    ['prefill', 'a', 'b'],
    ['decode', 'b', 'a'],
  ] as const) {
    procs.push(
      pdctl(
        tree,
        host,
        [
          'engine',
          ...[
            '--role',
            role,
            '--id',
            ids[role],
            '--control',
            `tcp://${hosts.address('c', host)}:${bus}`,
          ],
          ...['--kv-transport', 'auto', '--log-level', 'warn'],
        ],
        {
          PDCTL_CURVE_SERVER_KEY: server.publicKey,
          PDCTL_CURVE_PUBLIC_KEY: keys[role].publicKey,
          PDCTL_CURVE_SECRET_KEY: keys[role].secretKey,
          UCX_TLS: 'tcp',
          UCX_NET_DEVICES: hosts.device(host, peer),
        },
      ),
    );
  }
  await ready(`both engines of ${tree} ready`, async () => {
    const { engines } = (await (await fetch(`${base}/v1/engines`, asOperator())).json()) as {
      engines: Array<{ state: string }>;
    };
    return engines.filter((e) => e.state === 'ready').length === 2;
  });
  return { tree, base, procs, data };
}

try {
  say('floor: ZeroMQ round trips between hosts a and c, and one-event commits inline at power …');
  const zeromq = createRequire(import.meta.url).resolve('zeromq');
  const port = 15640;
  const ping = hosts.spawn('c', process.execPath, [
    '-e',
    PING,
    zeromq,
    `tcp://0.0.0.0:${port}`,
    '1000',
  ]);
  let pingOut = '';
  ping.stdout?.on('data', (d: Buffer) => {
    pingOut += d.toString();
  });
  const pinged = new Promise((r) => ping.once('exit', r));
  await new Promise((r) => setTimeout(r, 300));
  const echo = hosts.spawn('a', process.execPath, [
    '-e',
    ECHO,
    zeromq,
    `tcp://${hosts.address('c', 'a')}:${port}`,
  ]);
  await pinged;
  echo.kill();
  const busRoundTripMs = Number((JSON.parse(pingOut) as { p50Ms: number }).p50Ms.toFixed(3));
  const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-hosts-floor-'));
  const inlineCommitMs = Number((1000 / inlineWriter(dir, 1, null).oneEventPerSec).toFixed(3));
  rmSync(dir, { recursive: true, force: true });
  const floorMs = Number((2 * busRoundTripMs + 2 * inlineCommitMs).toFixed(3));

  for (const [n, tree] of TREES.entries()) {
    say(`starting the stack of ${tree} on hosts c, a, b …`);
    stacks.push(await startStack(tree, n));
  }
  const samples = stacks.map(emptySample);
  for (const [n, s] of stacks.entries()) await loneRooms(s.base, 20, 10_000, samples[n] as Sample); // warm-up
  for (const sample of samples) {
    sample.addedMs = [];
    sample.steps.clear();
  }
  for (let round = 0; round < ROUNDS; round++) {
    // Interleaved, each stack first in turn: the machine's drift falls on all alike.
    const order = stacks.map((_, i) => (i + round) % stacks.length);
    for (const n of order) {
      say(`round ${round + 1}/${ROUNDS}: ${ROOMS} lone rooms through ${stacks[n]?.tree}`);
      await loneRooms((stacks[n] as Stack).base, ROOMS, round * ROOMS, samples[n] as Sample);
    }
  }
  const rows: Row[] = [];
  for (const [n, s] of stacks.entries()) {
    const sample = samples[n] as Sample;
    const ms = [...sample.addedMs].sort((a, b) => a - b);
    const p50 = Number(percentile(ms, 50).toFixed(2));
    rows.push({
      tree: s.tree,
      rooms: ms.length,
      failed: sample.failed,
      addedMsP50: p50,
      addedMsP99: Number(percentile(ms, 99).toFixed(2)),
      inFloors: Number((p50 / floorMs).toFixed(2)),
      commitsP50: medianBucket(await commitDepths(s.base)),
      stepsMeanMs: stepMeans(sample),
    });
  }
  if (asJson) {
    process.stdout.write(
      `${JSON.stringify({ bench: 'engines-hosts', cores: cpus().length, node: process.version, rounds: ROUNDS, roomsPerRound: ROOMS, promptWords: PROMPT_WORDS, maxTokens: MAX_TOKENS, floor: { ms: floorMs, busRoundTripMs, inlineCommitMs }, rows }, null, 2)}\n`,
    );
  } else {
    const lines = [
      `pdctl engines across test hosts — ${cpus().length} cores, node ${process.version}; serve on host c, prefill on a, decode on b, KV over UCX (TCP);`,
      `lone rooms over HTTP, prompt ${PROMPT_WORDS} words, ${MAX_TOKENS} tokens out, near-zero compute; ${ROUNDS} rounds of ${ROOMS} rooms per stack, interleaved.`,
      `Floor of a 2-commit path, this run: 2 ZeroMQ round trips a↔c (${busRoundTripMs} ms each) + 2 one-event commits inline at power (${inlineCommitMs} ms each) = ${floorMs} ms.`,
      '',
      '| tree | rooms | failed | added p50 ms | added p99 ms | p50 in floors | commits p50 |',
      '|---|--:|--:|--:|--:|--:|--:|',
      ...rows.map(
        (r) =>
          `| ${r.tree} | ${r.rooms} | ${r.failed} | ${r.addedMsP50} | ${r.addedMsP99} | ${r.inFloors} | ${r.commitsP50 ?? '-'} |`,
      ),
      '',
      'added = the request as this client saw it (HTTP on host c included) minus the compute the engines journaled.',
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
