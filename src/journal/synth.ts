/**
 * A realistic synthetic journal: rooms arriving over a time span on a few engine pairs, most
 * completing, some aborted by clients or failed at every stage with the reasons real PD stacks
 * see, a few migrated, and the late events that real races produce. Deterministic for a seed.
 * Events stream out in time order; they are appended through the real append path.
 */
import type { EventInput } from '../room/events.ts';
import { newRoomId } from '../room/ids.ts';
import type { RoomFailureReason } from '../room/reasons.ts';
import { DEFAULT_STATE_DEADLINES_MS, LIVE_STATES, type LiveState } from '../room/states.ts';

export interface SynthOptions {
  rooms: number;
  seed: number;
  /** Time span the rooms arrive over (ms). */
  spanMs: number;
  /** Arrivals end here (unix ms); events later than this are not written, so rooms are in flight. */
  endTs: number;
  prefill: string[];
  decode: string[];
  /**
   * Engine stalls to stage (default 0): for 15–30 s one engine stops serving; the rooms sent to it
   * meanwhile fail when the watchdog steps in, with the engine and recovery events around them.
   */
  incidents?: number;
}

interface Incident {
  engine: string;
  role: 'prefill' | 'decode';
  from: number;
  until: number;
}

/** mulberry32: small, fast, good enough for synthetic data. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A min-heap of pending events by time, so interleaved room lifecycles come out in ts order. */
class Heap {
  private readonly items: EventInput[] = [];
  get size(): number {
    return this.items.length;
  }
  push(ev: EventInput): void {
    const a = this.items;
    a.push(ev);
    let i = a.length - 1;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if ((a[p]?.ts as number) <= (ev.ts as number)) break;
      a[i] = a[p] as EventInput;
      i = p;
    }
    a[i] = ev;
  }
  peekTs(): number {
    return (this.items[0]?.ts as number) ?? Number.POSITIVE_INFINITY;
  }
  pop(): EventInput | undefined {
    const a = this.items;
    const top = a[0];
    const last = a.pop();
    if (a.length > 0 && last) {
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (
          l < a.length &&
          (a[l]?.ts as number) < (m === i ? (last.ts as number) : (a[m]?.ts as number))
        )
          m = l;
        if (
          r < a.length &&
          (a[r]?.ts as number) < (m === i ? (last.ts as number) : (a[m]?.ts as number))
        )
          m = r;
        if (m === i) break;
        a[i] = a[m] as EventInput;
        i = m;
      }
      a[i] = last;
    }
    return top;
  }
}

/** How a room in each state fails, with reasons of journal/reasons.ts and who finds it. */
const FAILURES: Record<LiveState, Array<[reason: RoomFailureReason, detectedBy: string]>> = {
  created: [['deadline_exceeded', 'watchdog']],
  bootstrapping: [
    ['kv_pool_full', 'decode_engine'],
    ['deadline_exceeded', 'watchdog'],
  ],
  waiting_for_input: [
    ['deadline_exceeded', 'watchdog'],
    ['engine_restarted', 'prefill_engine'],
  ],
  prefilling: [
    ['engine_restarted', 'prefill_engine'],
    ['prefill_error', 'prefill_engine'],
  ],
  transferring: [
    ['transfer_stalled', 'transfer_core'],
    ['kv_checksum_mismatch', 'decode_engine'],
    ['transfer_epoch_mismatch', 'transfer_core'],
  ],
  transferred: [['engine_restarted', 'decode_engine']],
  decoding: [
    ['engine_restarted', 'decode_engine'],
    ['deadline_exceeded', 'watchdog'],
  ],
};

/** Yields events in time order. `stats` is filled in as it goes. */
export function* synthEvents(
  opts: SynthOptions,
  stats: { roomsStarted: number } = { roomsStarted: 0 },
): Generator<EventInput> {
  const rand = rng(opts.seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)] as T;
  const logn = (median: number, spread = 0.6) =>
    median *
    Math.exp(spread * Math.sqrt(-2 * Math.log(rand() || 1e-9)) * Math.cos(2 * Math.PI * rand()));
  const heap = new Heap();
  const startTs = opts.endTs - opts.spanMs;
  const gap = opts.spanMs / Math.max(1, opts.rooms);
  const src = 'synth';

  for (const [i, engine] of [...opts.prefill, ...opts.decode].entries()) {
    heap.push({
      type: 'engine.registered',
      engine,
      source: src,
      ts: startTs - 1000 + i,
      data: { role: i < opts.prefill.length ? 'prefill' : 'decode', incarnation: '1' },
    });
  }

  const incidents: Incident[] = [];
  for (let n = 0; n < (opts.incidents ?? 0); n++) {
    const role = rand() < 0.5 ? 'prefill' : 'decode';
    const engine = pick(role === 'prefill' ? opts.prefill : opts.decode);
    const from = Math.round(startTs + opts.spanMs * (0.1 + 0.75 * rand()));
    const until = from + Math.round(15_000 + 15_000 * rand());
    incidents.push({ engine, role, from, until });
    const sys = (type: EventInput['type'], ts: number, data: Record<string, unknown>) =>
      heap.push({ type, engine, source: 'watchdog', ts, data } as EventInput);
    sys('engine.stalled', from + 3000, { reason: 'loop_ticks_stopped', loop: 'bus' });
    sys('recovery.action', until, {
      action: 'fail_overdue_rooms',
      reason: 'engine_stalled',
      outcome: 'ok',
    });
    sys('recovery.action', until + 20, {
      action: 'restart_engine',
      reason: 'engine_stalled',
      outcome: 'ok',
    });
    sys('engine.restarted', until + 40, { reason: 'stalled', incarnation: '2' });
    sys('engine.recovered', until + 2500, { reason: 'heartbeats_fresh' });
  }
  // Rooms are sent to the stalled engine until the watchdog declares it stalled (3 s in); after
  // that the control plane routes around it.
  const stalledAt = (t: number, p: string, d: string) =>
    incidents.find((x) => t >= x.from && t < x.from + 3000 && (x.engine === p || x.engine === d)) ??
    null;

  // A request's id (x-request-id) is its first room's: a migrated continuation keeps it.
  const lifecycle = (
    room: string,
    t0: number,
    p: string,
    d: string,
    migratedFrom?: string,
    requestId = `req-${room}`,
  ) => {
    const out: EventInput[] = [];
    let t = t0;
    const at = (dt: number) => {
      t += Math.max(1, Math.round(dt));
      return t;
    };
    const promptTokens = Math.round(logn(600, 0.8));
    const maxTokens = pick([64, 128, 256, 512]);
    out.push({
      type: 'room.created',
      room,
      // A migrated request's continuation is created by the control plane, as in a real stack.
      source: migratedFrom ? 'migration' : 'api',
      ts: t,
      data: {
        prefillEngine: p,
        decodeEngine: d,
        promptTokens,
        maxTokens,
        model: 'pdctl-tiny',
        requestId,
        ...(migratedFrom ? { migratedFrom } : {}),
      },
    });
    const roll = rand();
    const stall = stalledAt(t0, p, d);
    const outcome = stall
      ? 'fail'
      : migratedFrom
        ? 'complete'
        : roll < 0.86
          ? 'complete'
          : roll < 0.91
            ? 'abort'
            : roll < 0.98
              ? 'fail'
              : 'migrate';
    // A room sent to a stalled engine waits for it: a stalled decode engine never bootstraps it,
    // a stalled prefill engine never picks it up.
    const stop: LiveState | null = stall
      ? stall.role === 'decode'
        ? 'created'
        : 'waiting_for_input'
      : outcome === 'complete'
        ? null
        : outcome === 'migrate'
          ? 'decoding'
          : pick(LIVE_STATES);
    const pages = Math.max(1, Math.ceil(promptTokens / 16));
    const kvBytes = pages * 65536;
    const steps: Array<[LiveState, () => EventInput]> = [
      [
        'bootstrapping',
        () => ({
          type: 'room.bootstrap_started',
          room,
          engine: d,
          source: d,
          ts: at(logn(0.6)),
          data: {},
        }),
      ],
      [
        'waiting_for_input',
        () => ({
          type: 'room.bootstrapped',
          room,
          engine: d,
          source: d,
          ts: at(logn(2)),
          data: { pages: Array.from({ length: pages }, (_, k) => k), epoch: 1 },
        }),
      ],
      [
        'prefilling',
        () => ({
          type: 'room.prefill_started',
          room,
          engine: p,
          source: p,
          ts: at(logn(15, 1)),
          data: {},
        }),
      ],
      [
        'transferring',
        () => ({
          type: 'room.transfer_posted',
          room,
          engine: p,
          source: p,
          ts: at(promptTokens * 0.04),
          data: { pairs: pages, bytes: kvBytes },
        }),
      ],
      [
        'transferred',
        () => {
          const micros = Math.round(kvBytes / 12_000 + logn(40));
          return {
            type: 'room.transfer_completed',
            room,
            engine: p,
            source: p,
            ts: at(micros / 1000),
            data: {
              bytes: kvBytes,
              checksum: Math.floor(rand() * 0xffffffff).toString(16),
              micros,
            },
          };
        },
      ],
      [
        'decoding',
        () => ({
          type: 'room.decode_started',
          room,
          engine: d,
          source: d,
          ts: at(logn(0.5)),
          data: {},
        }),
      ],
    ];
    let state: LiveState = 'created';
    for (const [next, make] of steps) {
      if (stop === state) break;
      out.push(make());
      state = next;
      if (state === 'transferred')
        out.push({
          type: 'room.released',
          room,
          engine: p,
          source: p,
          ts: at(0.2),
          data: { pages },
        });
    }
    // Who holds pages: decode from bootstrapping on, prefill from prefilling until it released
    // them after the transfer. Each engine releases every room of its own once it ends, holding
    // pages or not, as engines do (retention takes only rooms released by both); one that held
    // none releases a millisecond later, drawing nothing (a seed's journal is otherwise as before).
    const reached = (x: LiveState) => LIVE_STATES.indexOf(state) >= LIVE_STATES.indexOf(x);
    /** `engine` releases the room: its pages if it held them since `holdsFrom`, else none. */
    const releasedBy = (engine: string, holdsFrom: LiveState) => {
      const held = reached(holdsFrom);
      out.push({
        type: 'room.released',
        room,
        engine,
        source: engine,
        ts: at(held ? logn(1) : 1),
        data: { pages: held ? pages : 0 },
      });
    };
    const release = () => {
      if (!reached('transferred')) releasedBy(p, 'prefilling');
      releasedBy(d, 'bootstrapping');
    };
    if (outcome === 'complete') {
      const tokens = rand() < 0.7 ? Math.round(maxTokens * (0.2 + 0.8 * rand())) : maxTokens;
      out.push({
        type: 'room.completed',
        room,
        engine: d,
        source: d,
        ts: at(tokens * logn(12, 0.3)),
        data: { tokens, finishReason: tokens === maxTokens ? 'length' : 'stop' },
      });
      release();
      if (rand() < 0.01) {
        // The client hung up just as the last token arrived: the AbortReq comes in late.
        out.push({
          type: 'room.abort_requested',
          room,
          source: 'api',
          ts: at(logn(3)),
          data: { reason: 'client_disconnect' },
        });
      }
    } else if (outcome === 'abort') {
      out.push({
        type: 'room.abort_requested',
        room,
        source: 'api',
        ts: at(logn(200, 1.2)),
        data: { reason: 'client_disconnect' },
      });
      out.push({
        type: 'room.aborted',
        room,
        source: 'control_plane',
        ts: at(logn(4)),
        data: { reason: 'client_disconnect', source: 'client' },
      });
      release();
    } else if (outcome === 'fail') {
      // A stalled engine's rooms outstay their deadline: the watchdog fails them.
      const [reason, detectedBy]: [RoomFailureReason, string] = stall
        ? ['deadline_exceeded', 'watchdog']
        : pick(FAILURES[state]);
      // The watchdog fails the room at its state's deadline, or when recovery ends the stall.
      const wait = stall
        ? Math.max(1, Math.min(stall.until - t, DEFAULT_STATE_DEADLINES_MS[state as LiveState])) +
          logn(5)
        : reason === 'deadline_exceeded'
          ? 30_000
          : logn(300, 1);
      out.push({
        type: 'room.failed',
        room,
        source: detectedBy,
        ts: at(wait),
        data: { reason, stage: state, detectedBy },
      });
      release();
    } else {
      const to = newRoomId(t);
      const ti = at(logn(1500, 0.5));
      out.push({ type: 'room.migrated', room, source: 'recovery', ts: ti, data: { toRoom: to } });
      out.push({
        type: 'recovery.action',
        room,
        engine: d,
        source: 'recovery',
        ts: at(0.1),
        data: { action: 'migrate_room', reason: 'decode_engine_lost', outcome: 'ok', toRoom: to },
      } as EventInput);
      release();
      const others = opts.decode.filter((x) => x !== d);
      return {
        out,
        follow: {
          room: to,
          from: room,
          t0: ti + 1,
          p,
          d: others.length ? pick(others) : d,
          requestId,
        },
      };
    }
    return { out, follow: null };
  };

  for (let i = 0; i < opts.rooms; i++) {
    const t0 = Math.round(startTs + i * gap + rand() * gap);
    while (heap.peekTs() <= t0) {
      const ev = heap.pop() as EventInput;
      if ((ev.ts as number) <= opts.endTs) yield ev;
    }
    stats.roomsStarted++;
    const k = Math.floor(rand() * Math.min(opts.prefill.length, opts.decode.length));
    let job: ReturnType<typeof lifecycle> | null = lifecycle(
      newRoomId(t0),
      t0,
      opts.prefill[k] as string,
      opts.decode[k] as string,
    );
    while (job) {
      for (const ev of job.out) heap.push(ev);
      job = job.follow
        ? lifecycle(
            job.follow.room,
            job.follow.t0,
            job.follow.p,
            job.follow.d,
            job.follow.from,
            job.follow.requestId,
          )
        : null;
    }
  }
  while (heap.size > 0) {
    const ev = heap.pop() as EventInput;
    if ((ev.ts as number) <= opts.endTs) yield ev;
  }
}

/**
 * The ten events of one room that goes through every stage and completes, both engines releasing
 * their pages: the fixed workload of the tests, the crash drill and the journal benchmark.
 */
export function completedRoomEvents(
  room: string,
  prefill = 'p0',
  decode = 'd0',
  source = 'api',
): EventInput[] {
  const p = prefill;
  const d = decode;
  return [
    {
      type: 'room.created',
      room,
      source,
      data: { prefillEngine: p, decodeEngine: d, promptTokens: 512, maxTokens: 8 },
    },
    { type: 'room.bootstrap_started', room, engine: d, source: d, data: {} },
    { type: 'room.bootstrapped', room, engine: d, source: d, data: { pages: [0, 1, 2, 3] } },
    { type: 'room.prefill_started', room, engine: p, source: p, data: {} },
    { type: 'room.transfer_posted', room, engine: p, source: p, data: { pairs: 4 } },
    {
      type: 'room.transfer_completed',
      room,
      engine: p,
      source: p,
      data: { bytes: 262144, checksum: '9f3a77c1', micros: 85 },
    },
    { type: 'room.released', room, engine: p, source: p, data: { pages: 4 } },
    { type: 'room.decode_started', room, engine: d, source: d, data: {} },
    {
      type: 'room.completed',
      room,
      engine: d,
      source: d,
      data: { tokens: 8, finishReason: 'length' },
    },
    { type: 'room.released', room, engine: d, source: d, data: { pages: 4 } },
  ];
}
