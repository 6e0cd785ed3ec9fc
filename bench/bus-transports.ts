/**
 * What one bus message costs, by transport: bare round trips between this process and a child
 * process echoing, over ZeroMQ (ROUTER and DEALER, loopback TCP, no CURVE: the bus as built, and
 * the floor bench:engines states its targets against) and over Node's own sockets (`node:net`,
 * loopback TCP and a Unix socket), in interleaved rounds. For each: the round trip's p50 and p99,
 * and the machine's CPU time per round trip (both processes, every thread, the kernel), with the
 * ratio to ZeroMQ's of the same round. One trip every `--pace-ms` ms, each side idle in between,
 * as a lone room's hops come (0: back to back).
 *
 *   npm run bench:bus-transports
 *   npm run bench:bus-transports -- --rounds 5 --trips 2000 --pace-ms 0
 *
 * docs/critical-path.md ("What bounds a lone room") has a run: why a lone room's CPU is mostly
 * its bus frames, and what the bus's transport costs of it.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as zmq from 'zeromq';
import { asJson, checkFlags, flag, machineCpuMs, percentile, say } from './args.ts';
import { ECHO } from './bus-echo.ts';

const ROUNDS = Number(flag('--rounds', '3'));
const TRIPS = Number(flag('--trips', '1000'));
const PACE_MS = Number(flag('--pace-ms', '1'));
const BYTES = Number(flag('--bytes', '200'));
checkFlags();
for (const [name, v, min] of [
  ['--rounds', ROUNDS, 1],
  ['--trips', TRIPS, 10],
  ['--pace-ms', PACE_MS, 0],
  ['--bytes', BYTES, 1],
] as const) {
  if (!Number.isInteger(v) || v < min) {
    process.stderr.write(`bench:bus-transports: ${name} must be a whole number ≥ ${min}\n`);
    process.exit(2);
  }
}

/** A child process connects `net.connect(argv[1] as a port or a path)` and echoes every byte. */
const NET_ECHO = `const net = require('node:net');
const at = process.argv[1];
const s = /^\\d+$/.test(at) ? net.connect(Number(at), '127.0.0.1') : net.connect(at);
s.setNoDelay(true);
s.on('data', (b) => s.write(b));`;

type Transport = 'zeromq tcp' | 'node:net tcp' | 'node:net unix';
const TRANSPORTS: Transport[] = ['zeromq tcp', 'node:net tcp', 'node:net unix'];

/** One round trip to the echo: resolves when the whole message is back. */
type Trip = () => Promise<void>;

interface Link {
  trip: Trip;
  close(): void;
}

const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-bus-'));
const payload = Buffer.alloc(BYTES, 7);

function child(script: string, args: string[]): ChildProcess {
  const c = spawn(process.execPath, ['-e', script, ...args], { stdio: 'ignore' });
  c.once('exit', (code, signal) => {
    if (!c.killed) say(`the echo process exited (${signal ?? code}) before it was stopped`);
  });
  return c;
}

async function zeromqLink(): Promise<Link> {
  const router = new zmq.Router({ linger: 0 });
  await router.bind('tcp://127.0.0.1:0');
  const zeromqPath = createRequire(import.meta.url).resolve('zeromq');
  const echo = child(ECHO, [zeromqPath, router.lastEndpoint as string]);
  const [peer] = await router.receive();
  return {
    trip: async () => {
      await router.send([peer as Buffer, payload]);
      await router.receive();
    },
    close: () => {
      echo.kill();
      router.close();
    },
  };
}

async function netLink(unix: boolean): Promise<Link> {
  const server: Server = createServer();
  const path = join(dir, `echo-${Date.now()}.sock`);
  await new Promise<void>((r) =>
    unix ? server.listen(path, r) : server.listen(0, '127.0.0.1', r),
  );
  const address = server.address();
  const at = unix ? path : String(typeof address === 'object' && address ? address.port : 0);
  const accepted = new Promise<Socket>((r) => server.once('connection', r));
  const echo = child(NET_ECHO, [at]);
  const socket = await accepted;
  socket.setNoDelay(true);
  let waiting: { left: number; done: () => void } | null = null;
  socket.on('data', (b: Buffer) => {
    if (!waiting) return;
    waiting.left -= b.length;
    if (waiting.left <= 0) waiting.done();
  });
  return {
    trip: () =>
      new Promise<void>((done) => {
        waiting = { left: payload.length, done };
        socket.write(payload);
      }),
    close: () => {
      echo.kill();
      socket.destroy();
      server.close();
    },
  };
}

interface Cell {
  p50Ms: number;
  p99Ms: number;
  cpuMs: number;
}

async function measure(transport: Transport): Promise<Cell> {
  const link =
    transport === 'zeromq tcp' ? await zeromqLink() : await netLink(transport === 'node:net unix');
  try {
    const pace = () => new Promise((r) => setTimeout(r, PACE_MS));
    for (let i = 0; i < 50; i++) await link.trip();
    const ms: number[] = [];
    const before = machineCpuMs();
    for (let i = 0; i < TRIPS; i++) {
      const t = performance.now();
      await link.trip();
      ms.push(performance.now() - t);
      if (PACE_MS > 0) await pace();
    }
    const cpu = machineCpuMs() - before;
    ms.sort((a, b) => a - b);
    return { p50Ms: percentile(ms, 50), p99Ms: percentile(ms, 99), cpuMs: cpu / TRIPS };
  } finally {
    link.close();
  }
}

const cells = new Map<Transport, Cell[]>(TRANSPORTS.map((t) => [t, []]));
try {
  for (let round = 1; round <= ROUNDS; round++) {
    for (const t of round % 2 === 1 ? TRANSPORTS : [...TRANSPORTS].reverse()) {
      say(`round ${round}/${ROUNDS}: ${TRIPS} round trips over ${t} …`);
      cells.get(t)?.push(await measure(t));
    }
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}

const median = (xs: number[]) =>
  percentile(
    [...xs].sort((a, b) => a - b),
    50,
  );
const r3 = (x: number) => Number(x.toFixed(3));
const zeromq = cells.get('zeromq tcp') ?? [];
const rows = TRANSPORTS.map((t) => {
  const cs = cells.get(t) ?? [];
  return {
    transport: t,
    p50Ms: r3(median(cs.map((c) => c.p50Ms))),
    p99Ms: r3(median(cs.map((c) => c.p99Ms))),
    cpuMs: r3(median(cs.map((c) => c.cpuMs))),
    // Each round against ZeroMQ's of the same round, then the median of those.
    cpuOfZeromq: r3(median(cs.map((c, i) => c.cpuMs / (zeromq[i]?.cpuMs ?? Number.NaN)))),
    p50OfZeromq: r3(median(cs.map((c, i) => c.p50Ms / (zeromq[i]?.p50Ms ?? Number.NaN)))),
  };
});

if (asJson) {
  process.stdout.write(
    `${JSON.stringify({ bench: 'bus-transports', rounds: ROUNDS, trips: TRIPS, paceMs: PACE_MS, bytes: BYTES, rows }, null, 2)}\n`,
  );
} else {
  const head = [
    'transport',
    'round trip p50 ms',
    'p99 ms',
    'CPU ms a round trip',
    'CPU × ZeroMQ',
    'p50 × ZeroMQ',
  ];
  const lines = [
    `| ${head.join(' | ')} |`,
    `|${head.map((_, i) => (i === 0 ? ' --- ' : ' ---: ')).join('|')}|`,
    ...rows.map(
      (r) =>
        `| ${r.transport} | ${r.p50Ms} | ${r.p99Ms} | ${r.cpuMs} | ${r.cpuOfZeromq} | ${r.p50OfZeromq} |`,
    ),
  ];
  process.stdout.write(
    `bench:bus-transports: ${BYTES}-byte messages, ${TRIPS} round trips a cell, one every ${PACE_MS} ms, ${ROUNDS} rounds interleaved (medians of the rounds; CPU: the whole machine's)\n\n${lines.join('\n')}\n`,
  );
}
