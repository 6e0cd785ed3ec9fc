/**
 * End-to-end engine benchmark: rooms per second through the whole stack (control plane, bus,
 * journal, one prefill and one decode engine process, transfer core) and the latency the control
 * plane adds per room (room time minus the model compute the engines measured and journaled), at
 * 1, 16 and 128 concurrent rooms, with near-zero model compute and a heavier setting. Baseline,
 * measured in the same run: the same requests generated in-process by the same model. Also in the
 * same run, what lies under the figures: a lone room whose commits do not wait for the disk, bare
 * ZeroMQ round trips between two processes, and the machine's CPU per room in every cell.
 *
 *   npm run bench:engines                  # a table
 *   npm run bench:engines -- --json        # one JSON object with stable keys
 *   npm run bench:engines -- --seconds 5 --durability process
 *   npm run bench:engines -- --lone        # only the lone rooms and the steps
 *   npm run bench:engines -- --lone --tree DIR     # the A/B of a change: this checkout's lone rooms
 *                                                  # and DIR's, rounds interleaved (engines-trees.ts)
 *   npm run bench:engines -- --hosts [--tree DIR]  # a lone room across test hosts (engines-hosts.ts)
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import * as zmq from 'zeromq';
import { startStack } from '../src/app/stack.ts';
import type { Durability } from '../src/journal/store.ts';
import { silentLogger } from '../src/log.ts';
import { DeterministicModel, generateInProcess } from '../src/model/deterministic.ts';
import type { JournalEvent } from '../src/room/events.ts';
import { ROOM_PATH } from '../src/room/states.ts';
import {
  argv,
  asJson,
  atRate,
  checkFlags,
  flag,
  has,
  medianBucket,
  percentile,
  say,
} from './args.ts';
import { ECHO } from './bus-echo.ts';
import { inlineWriter } from './inline-writer.ts';

if (has('--hosts')) {
  // The lone room across test hosts, before/after trees side by side (engines-hosts.ts).
  await import('./engines-hosts.ts');
  process.exit(0);
}
if (has('--lone') && argv.includes('--tree')) {
  // Lone rooms of this checkout and other trees side by side, rounds interleaved (engines-trees.ts).
  await import('./engines-trees.ts');
  process.exit(0);
}

const SECONDS = Number(flag('--seconds', '3'));
const DURABILITY = flag('--durability', 'power') as Durability;
const PROMPT_WORDS = 32;
const MAX_TOKENS = 16;
/** `--lone`: only the lone rooms with near-zero compute (with and without fsync), and the steps. */
const LONE = has('--lone');
checkFlags();
const CONCURRENCY = LONE ? [1] : [1, 16, 128];

interface Setting {
  name: string;
  prefillUs: number;
  decodeUs: number;
  durability: Durability;
  /** Closed-loop cells; an open loop at half their best follows unless `openLoop` is false. */
  concurrency: number[];
  openLoop: boolean;
}
const NEAR_ZERO = 'near-zero compute';
const ALL_SETTINGS: Setting[] = [
  {
    name: NEAR_ZERO,
    prefillUs: 0,
    decodeUs: 0,
    durability: DURABILITY,
    concurrency: CONCURRENCY,
    openLoop: !LONE,
  },
  // The same lone room with commits that do not wait for the disk: what the bus, the engines and
  // the processes' turns cost alone, the floor under the lone-room figure on this machine.
  ...(DURABILITY === 'power'
    ? [
        {
          name: `${NEAR_ZERO}, durability process (no fsync)`,
          prefillUs: 0,
          decodeUs: 0,
          durability: 'process' as const,
          concurrency: [1],
          openLoop: false,
        },
      ]
    : []),
  {
    name: 'compute 20 µs/prompt token, 250 µs/step',
    prefillUs: 20,
    decodeUs: 250,
    durability: DURABILITY,
    concurrency: CONCURRENCY,
    openLoop: true,
  },
];
const SETTINGS = LONE ? ALL_SETTINGS.filter((st) => st.prefillUs === 0) : ALL_SETTINGS;

/** CPU time of the whole machine so far (every process, this one included), in ms, from os.cpus(). */
function machineCpu(): { busy: number; idle: number } {
  let busy = 0;
  let idle = 0;
  for (const { times: t } of cpus()) {
    busy += t.user + t.nice + t.sys + t.irq;
    idle += t.idle;
  }
  return { busy, idle };
}

function promptOf(i: number): string {
  const words = [
    'amber',
    'north',
    'kettle',
    'orbit',
    'willow',
    'granite',
    'velvet',
    'ferry',
    'quartz',
    'lilac',
  ];
  return Array.from({ length: PROMPT_WORDS }, (_, k) => words[(i * 3 + k * 7) % words.length]).join(
    ' ',
  );
}

interface Row {
  setting: string;
  /** Rooms kept in flight (closed loop), or `open loop N/s`. */
  concurrency: number | string;
  rooms: number;
  roomsPerSec: number;
  inProcessRoomsPerSec: number;
  ratio: number;
  roomMsP50: number;
  roomMsP99: number;
  /** Submit to the first chunk the caller reads (protocol 9: from the prefill engine), p50. */
  firstTokenMsP50: number;
  computeMsP50: number;
  addedMsP50: number;
  addedMsP99: number;
  failed: number;
  /** The machine's CPUs busy during the cell, in % of all of them (every process on it). */
  cpuBusyPct: number;
  /** CPU time the machine spent per room completed: all cores, all processes. */
  cpuMsPerRoom: number;
  /** Median commits in sequence behind a room's first token (control/commit-depth.ts); null: none counted. */
  commitsP50: number | null;
  /** Bus frames the control plane received and sent over the cell, per room (a batch is one). */
  framesPerRoom: number;
}

/** A room as its caller timed it: submit to its end and to its first chunk, in ms. */
interface Timed {
  ms: number;
  at: number;
  done: number;
  first: number;
}

/** Reads the room's stream to its end; resolves with the ms from `t0` to its first chunk (NaN: none). */
async function firstTokenMs(stream: AsyncIterable<unknown>, t0: number): Promise<number> {
  let first = Number.NaN;
  for await (const _ of stream) if (Number.isNaN(first)) first = performance.now() - t0;
  return first;
}

/**
 * The bus's floor on this machine, measured in the same run: bare ZeroMQ round trips between this
 * process (ROUTER) and a child process echoing (DEALER), loopback TCP, no CURVE, one every
 * millisecond as a lone room's hops come (each side idle in between). The p50 round trip, and the
 * machine's CPU time per round trip: both processes, their ZeroMQ I/O threads, the kernel.
 */
async function busRoundTrip(count: number): Promise<{ p50Ms: number; cpuMs: number }> {
  const router = new zmq.Router({ linger: 0 });
  await router.bind('tcp://127.0.0.1:0');
  const zeromqPath = createRequire(import.meta.url).resolve('zeromq');
  const echo = spawn(process.execPath, ['-e', ECHO, zeromqPath, router.lastEndpoint as string], {
    stdio: 'ignore',
  });
  const sleep = () => new Promise((r) => setTimeout(r, 1));
  const exited = new Promise<never>((_, reject) =>
    echo.once('exit', (code, signal) =>
      reject(
        new Error(`the bus round-trip echo process exited (${signal ?? code}) before it answered`),
      ),
    ),
  );
  exited.catch(() => undefined); // it exits when killed below, after the measurement
  try {
    const [peer] = await Promise.race([router.receive(), exited]);
    const trip = async () => {
      const t = performance.now();
      await router.send([peer as Buffer, 'ping']);
      await router.receive();
      return performance.now() - t;
    };
    for (let i = 0; i < 50; i++) await trip();
    const ms: number[] = [];
    const before = machineCpu();
    for (let i = 0; i < count; i++) {
      ms.push(await trip());
      await sleep();
    }
    const busy = machineCpu().busy - before.busy;
    ms.sort((a, b) => a - b);
    return {
      p50Ms: Number(percentile(ms, 50).toFixed(3)),
      cpuMs: Number((busy / count).toFixed(3)),
    };
  } finally {
    echo.kill();
    router.close();
  }
}

const rows: Row[] = [];
const r2 = (x: number) => Number(x.toFixed(2));
const r3 = (x: number) => Number(x.toFixed(3));

/** One step of a lone room: from one journal event to the next, as the journal timed them. */
interface Step {
  step: string;
  rooms: number;
  meanMs: number;
}
const steps: Step[] = [];

/**
 * The events on a room's critical path (protocol 7): the decode engine's acknowledgement of its
 * reserved pages (`room.bootstrap_started`, `room.bootstrapped`) runs beside the prefill and is
 * timed on its own row.
 */
const PATH = ROOM_PATH.filter((t) => t !== 'room.bootstrap_started' && t !== 'room.bootstrapped');

/**
 * Where a lone room's time goes: the mean time from each critical-path event to the next, from
 * the journal's own timestamps (whole milliseconds, so the means over hundreds of rooms are what
 * count), plus submit → room.created and room.completed → the caller's answer, and off the path
 * room.created → room.bootstrapped. `released` events are off the path too (the answer does not
 * wait for them) and left out.
 */
function breakdown(byRoom: Map<string, JournalEvent[]>, times: Map<string, Timed>): Step[] {
  const names = ['submit', ...PATH, 'answer'];
  const totals = new Array<number>(names.length - 1).fill(0);
  let ack = 0;
  let n = 0;
  for (const [room, events] of byRoom) {
    const t = times.get(room);
    if (!t) continue;
    const ts = (type: string) => events.find((e) => e.type === type)?.ts;
    const at = PATH.map(ts);
    const acked = ts('room.bootstrapped');
    if (at.some((x) => x === undefined) || acked === undefined) continue;
    const marks = [t.at, ...(at as number[]), t.done];
    for (let i = 1; i < marks.length; i++)
      totals[i - 1] = (totals[i - 1] as number) + ((marks[i] as number) - (marks[i - 1] as number));
    ack += acked - (at[0] as number);
    n++;
  }
  const mean = (total: number) => Number((total / Math.max(1, n)).toFixed(3));
  return [
    ...totals.map((total, i) => ({
      step: `${names[i]} → ${names[i + 1]}`,
      rooms: n,
      meanMs: mean(total),
    })),
    { step: 'room.created → room.bootstrapped (beside the path)', rooms: n, meanMs: mean(ack) },
  ];
}
say('bus floor: 1,000 bare ZeroMQ round trips between two processes …');
const bus = await busRoundTrip(1000);
const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-engines-'));
say('journal floor: one-event commits at power, the writer inline (no queue, no thread) …');
/**
 * The floor of the redesigned path (docs/critical-path.md), measured in this run: two bus round
 * trips and two commits of the journal's writer inline.
 */
const inlineCommitMs = r3(1000 / inlineWriter(dir, 1, null).oneEventPerSec);
const floorMs = r3(2 * bus.p50Ms + 2 * inlineCommitMs);
try {
  for (const setting of SETTINGS) {
    // Baseline: the model's own compute for the same requests, in this process, one at a time.
    const model = new DeterministicModel({
      prefillUsPerToken: setting.prefillUs,
      decodeUsPerToken: setting.decodeUs,
    });
    let n = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < 1000) generateInProcess(model, promptOf(n++), MAX_TOKENS);
    const inProcessRoomsPerSec = n / ((performance.now() - t0) / 1000);

    const stack = await startStack({
      journalPath: join(dir, `${rows.length}.db`),
      durability: setting.durability,
      log: silentLogger,
      version: 'bench',
      engineLogLevel: 'error',
      engineArgs: [
        '--prefill-us-per-token',
        String(setting.prefillUs),
        '--decode-us-per-token',
        String(setting.decodeUs),
        '--pages',
        '16384',
        '--prefill-concurrency',
        '64',
      ],
    });
    try {
      const { control } = stack;
      // Warm up: JIT, sockets, page faults in both pools.
      await Promise.all(
        Array.from(
          { length: 64 },
          (_, i) => control.submit({ prompt: promptOf(i), maxTokens: MAX_TOKENS }).result,
        ),
      );
      /** The journal's events since `fromSeq`, all of them. */
      const eventsSince = async (fromSeq: number) => {
        const events = [];
        for (let after = fromSeq; ; ) {
          const chunk = await control.journal.readFrom(after, 10_000);
          events.push(...chunk);
          if (chunk.length < 10_000) break;
          after = chunk[chunk.length - 1]?.seq as number;
        }
        return events;
      };
      /** The control plane's count of rooms by the commits in sequence behind their decode. */
      const depths = () => [...control.book.firstTokenCommits()];
      /** Bus frames the control plane has received and sent so far. */
      const frames = () => {
        const f = control.busStatus().frames;
        return f.received + f.sent;
      };
      /** The median of those counts since `before` was taken. */
      const medianDepth = (before: number[]): number | null =>
        medianBucket(depths().map((n, d) => n - (before[d] ?? 0)));
      /** One row from the rooms timed (room → ms seen by the caller, and when it was submitted). */
      const row = async (
        concurrency: number | string,
        fromSeq: number,
        times: Map<string, Timed>,
        elapsed: number,
        failed: number,
        cpuBefore: ReturnType<typeof machineCpu>,
        depthsBefore: number[],
        framesBefore: number,
      ) => {
        const cpuNow = machineCpu();
        const busyMs = cpuNow.busy - cpuBefore.busy;
        const idleMs = cpuNow.idle - cpuBefore.idle;
        // What the engines measured and journaled: prefill and decode compute per room.
        const compute = new Map<string, number>();
        const byRoom = new Map<string, JournalEvent[]>();
        for (const ev of await eventsSince(fromSeq)) {
          if (!ev.room || !times.has(ev.room)) continue;
          const list = byRoom.get(ev.room);
          if (list) list.push(ev);
          else byRoom.set(ev.room, [ev]);
          if (ev.type !== 'room.transfer_posted' && ev.type !== 'room.completed') continue;
          const us = (ev.data as { computeMicros?: number }).computeMicros ?? 0;
          compute.set(ev.room, (compute.get(ev.room) ?? 0) + us / 1000);
        }
        const roomMs = [...times.values()].map((t) => t.ms).sort((a, b) => a - b);
        const computeMs = [...times.keys()].map((r) => compute.get(r) ?? 0).sort((a, b) => a - b);
        const added = [...times.entries()]
          .map(([r, t]) => t.ms - (compute.get(r) ?? 0))
          .sort((a, b) => a - b);
        const firstMs = [...times.values()].map((t) => t.first).sort((a, b) => a - b);
        const roomsPerSec = times.size / elapsed;
        rows.push({
          setting: setting.name,
          concurrency,
          rooms: times.size,
          roomsPerSec: Math.round(roomsPerSec),
          inProcessRoomsPerSec: Math.round(inProcessRoomsPerSec),
          ratio: Number((roomsPerSec / inProcessRoomsPerSec).toFixed(3)),
          roomMsP50: r2(percentile(roomMs, 50)),
          roomMsP99: r2(percentile(roomMs, 99)),
          firstTokenMsP50: r2(percentile(firstMs, 50)),
          computeMsP50: r2(percentile(computeMs, 50)),
          addedMsP50: r2(percentile(added, 50)),
          addedMsP99: r2(percentile(added, 99)),
          failed,
          cpuBusyPct: Math.round((100 * busyMs) / Math.max(1, busyMs + idleMs)),
          cpuMsPerRoom: r2(busyMs / Math.max(1, times.size)),
          commitsP50: medianDepth(depthsBefore),
          framesPerRoom: r2((frames() - framesBefore) / Math.max(1, times.size)),
        });
        return { byRoom, roomsPerSec };
      };
      let capacity = 0;
      for (const concurrency of setting.concurrency) {
        say(`${setting.name}: ${concurrency} concurrent rooms for ${SECONDS}s …`);
        const times = new Map<string, Timed>();
        const fromSeq = await control.journal.headSeq();
        let failed = 0;
        const end = performance.now() + SECONDS * 1000;
        const cpuBefore = machineCpu();
        const depthsBefore = depths();
        const framesBefore = frames();
        const started = performance.now();
        const client = async (c: number) => {
          for (let i = 0; performance.now() < end; i++) {
            const t = performance.now();
            const at = Date.now();
            const s = control.submit({ prompt: promptOf(c * 1000 + i), maxTokens: MAX_TOKENS });
            try {
              const first = await firstTokenMs(s, t);
              await s.result;
              times.set(s.room, { ms: performance.now() - t, at, done: Date.now(), first });
            } catch {
              failed++;
            }
          }
        };
        await Promise.all(Array.from({ length: concurrency }, (_, c) => client(c)));
        const elapsed = (performance.now() - started) / 1000;
        const { byRoom, roomsPerSec } = await row(
          concurrency,
          fromSeq,
          times,
          elapsed,
          failed,
          cpuBefore,
          depthsBefore,
          framesBefore,
        );
        capacity = Math.max(capacity, roomsPerSec);
        if (concurrency === 1 && setting.name === NEAR_ZERO)
          steps.push(...breakdown(byRoom, times));
      }
      if (!setting.openLoop) continue;
      // Open loop: requests at half the capacity just measured, sent on time whether or not the
      // earlier ones have finished (as independent clients do).
      const rate = Math.max(1, Math.round(capacity / 2));
      say(
        `${setting.name}: open loop at ${rate} rooms/s (half of ${Math.round(capacity)}) for ${SECONDS}s …`,
      );
      const times = new Map<string, Timed>();
      const fromSeq = await control.journal.headSeq();
      let failed = 0;
      const cpuBefore = machineCpu();
      const depthsBefore = depths();
      const framesBefore = frames();
      const started = performance.now();
      await atRate(rate, SECONDS, async (i) => {
        const t = performance.now();
        const at = Date.now();
        const s = control.submit({ prompt: promptOf(i), maxTokens: MAX_TOKENS });
        try {
          const first = await firstTokenMs(s, t);
          await s.result;
          times.set(s.room, { ms: performance.now() - t, at, done: Date.now(), first });
        } catch {
          failed++;
        }
      });
      await row(
        `open loop ${rate}/s`,
        fromSeq,
        times,
        (performance.now() - started) / 1000,
        failed,
        cpuBefore,
        depthsBefore,
        framesBefore,
      );
    } finally {
      await stack.stop();
    }
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}

const lone = rows.find((r) => r.setting === NEAR_ZERO && r.concurrency === 1);
const loneNoFsync = rows.find((r) => r.setting.startsWith(`${NEAR_ZERO},`) && r.concurrency === 1);
const open = rows.find((r) => r.setting === NEAR_ZERO && String(r.concurrency).startsWith('open'));
/** The open-loop p99 in lone-room p50s (near-zero compute): target ≤ 3. */
const openP99InLoneP50 = lone && open ? r2(open.addedMsP99 / lone.addedMsP50) : null;
/** The lone-room added p50 and the open-loop added p99 in floors (target for the lone room: ≤ 2). */
const loneInFloors = lone ? r2(lone.addedMsP50 / floorMs) : null;
const openP99InFloors = open ? r2(open.addedMsP99 / floorMs) : null;

if (asJson) {
  process.stdout.write(
    `${JSON.stringify({ bench: 'engines', cores: cpus().length, node: process.version, durability: DURABILITY, seconds: SECONDS, promptWords: PROMPT_WORDS, maxTokens: MAX_TOKENS, rows, loneRoomSteps: steps, openP99InLoneP50, busRoundTrip: bus, floor: { ms: floorMs, inlineCommitMs, busRoundTripMs: bus.p50Ms }, loneInFloors, openP99InFloors }, null, 2)}\n`,
  );
} else {
  const out = [
    `pdctl engines benchmark — ${cpus().length} cores, node ${process.version}, durability ${DURABILITY}, ${SECONDS}s per cell,`,
    `1 prefill + 1 decode engine, prompt ${PROMPT_WORDS} tokens, ${MAX_TOKENS} tokens out. Baseline: the same model in-process.`,
    '',
    '| model setting | concurrent | rooms | rooms/s | in-process rooms/s | ratio | room p50 ms | room p99 ms | first token p50 ms | compute p50 ms | added p50 ms | added p99 ms | failed | CPU busy % | CPU ms/room | commits p50 | bus frames/room |',
    '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
    ...rows.map(
      (r) =>
        `| ${r.setting} | ${r.concurrency} | ${r.rooms} | ${r.roomsPerSec} | ${r.inProcessRoomsPerSec} | ${r.ratio} | ${r.roomMsP50} | ${r.roomMsP99} | ${r.firstTokenMsP50} | ${r.computeMsP50} | ${r.addedMsP50} | ${r.addedMsP99} | ${r.failed} | ${r.cpuBusyPct} | ${r.cpuMsPerRoom} | ${r.commitsP50 ?? '-'} | ${r.framesPerRoom} |`,
    ),
    '',
    `Near-zero compute: lone-room added p50 ${lone?.addedMsP50} ms${loneNoFsync ? `, ${loneNoFsync.addedMsP50} ms with commits that do not wait for the disk` : ''}${open ? `; open-loop added p99 ${open.addedMsP99} ms = ${openP99InLoneP50}× the lone-room p50 (target ≤ 3)` : ''}.`,
    `The bus's floor in this run: a bare ZeroMQ round trip between two processes (loopback, no CURVE, 1 ms apart) takes ${bus.p50Ms} ms p50 and ${bus.cpuMs} ms of CPU; a lone room's first token comes behind ${lone?.commitsP50 ?? '-'} commit${lone?.commitsP50 === 1 ? '' : 's'} in sequence (protocol 9: room.created; docs/critical-path.md), with a bus hop on either side, ${lone?.firstTokenMsP50 ?? '-'} ms p50 after its submit.`,
    `The floor of a path of 2 commits, measured in this run: 2 bus round trips + 2 one-event commits of the journal writer inline at power (${inlineCommitMs} ms each) = ${floorMs} ms. Lone-room added p50 = ${loneInFloors ?? '-'}× the floor (target ≤ 3)${openP99InFloors !== null ? `; open-loop added p99 = ${openP99InFloors}× the floor` : ''}.`,
    ...(lone
      ? [
          `A lone room moves ${lone.framesPerRoom} bus frames through the control plane; at the bus floor's CPU per frame (half a bare round trip's, ${r3(bus.cpuMs / 2)} ms) they alone cost ${r2((lone.framesPerRoom * bus.cpuMs) / 2)} ms of CPU, of the lone room's ${lone.cpuMsPerRoom} ms (target ≤ 3 over all processes).`,
        ]
      : []),
    ...(open
      ? [
          `CPU per room, near-zero compute: ${rows
            .filter((r) => r.setting === NEAR_ZERO)
            .map((r) => `${r.cpuMsPerRoom} ms at ${r.concurrency}`)
            .join(', ')} (machine ${open.cpuBusyPct}% busy in the open loop).`,
        ]
      : []),
    '',
    'A lone room, step by step (near-zero compute, 1 concurrent; mean ms between its consecutive journal events):',
    '',
    '| step | rooms | mean ms |',
    '|---|--:|--:|',
    ...steps.map((st) => `| ${st.step} | ${st.rooms} | ${st.meanMs} |`),
    `| total (mean of the steps on the path) | | ${r2(steps.filter((st) => !st.step.includes('beside')).reduce((n, st) => n + st.meanMs, 0))} |`,
    '',
    'added = room time seen by the caller minus the model compute the engines journaled for that room',
    '(queueing behind other rooms on this CPU-only model counts as added). CPU busy and CPU ms/room count every',
    'process on the machine (this one with the control plane, both engines) over the cell. Open loop: rooms sent at half the',
    'capacity the closed-loop cells measured, on schedule. first token: submit to the first chunk the caller read. commits p50: the',
    "median, over the cell's rooms, of the journal commits in sequence behind a room's first token, as the control plane counted",
    'them from the events engines said they acted on.',
    'bus frames/room: frames the control plane received from and sent to the engines over the cell, per room (a batch is one).',
    'Targets: lone-room added p50 ≤ 3× the floor and ≤ 3 ms of CPU; open-loop added',
    'p99 ≤ 3× the lone-room added p50; ≥ 1,000 rooms/s with near-zero compute.',
  ];
  process.stdout.write(`${out.join('\n')}\n`);
}
