/**
 * Retention while serving (`pdctl serve --retain`): a pass every so often prunes whole terminal
 * rooms past the horizon, and events of no room past theirs, from the writer, a small chunk per
 * transaction (prune.ts), so appends wait behind at most one chunk. An operator's prune (the
 * admin route, `pdctl journal prune --url`) runs through the same object: one pass at a time.
 * Only a leading control plane holds one: a standby writes nothing.
 */
import type { Logger } from '../log.ts';
import type { Clock, Timer } from '../ports/clock.ts';
import { type Files, nodeFiles } from '../ports/files.ts';
import { archiveChunk } from './archive/segments.ts';
import type { JournalStore, PruneResult } from './store.ts';

export interface RetentionPolicy {
  /** Terminal rooms are kept this long after they end. */
  roomsMs: number;
  /** Events of no room are kept this long; at least `roomsMs`. Default `roomsMs`; null: kept. */
  eventsMs?: number | null;
  /** Between passes. Default a tenth of `roomsMs`, from 10 s to 10 min. */
  everyMs?: number;
  /** Rooms per transaction. Default 25 (docs/benchmarks.md, "Retention while serving"). */
  chunkRooms?: number;
  /**
   * The share of the writer's time a pass may take: after a chunk that took t ms it rests
   * t × (1 − duty) / duty. Default 0.5 (a chunk, then a rest as long). 1: no rest.
   */
  duty?: number;
  /** Write what each pass deletes to this archive first (archive/segments.ts); null: none. */
  archiveDir?: string | null;
}

/** One pass: what asked for it, its horizons, and how far it got. */
export interface RetentionPass {
  by: 'schedule' | 'operator';
  startedAt: number;
  /** Null while it runs. */
  ms: number | null;
  result: PruneResult;
  error: string | null;
}

export interface RetentionStatus {
  policy: Required<RetentionPolicy> | null;
  running: RetentionPass | null;
  last: RetentionPass | null;
  /** The last pass an operator asked for (a scheduled one may have run since). */
  lastByOperator: RetentionPass | null;
  /** Since this control plane started. */
  totals: { passes: number; rooms: number; events: number; otherEvents: number };
}

export const DEFAULT_CHUNK_ROOMS = 25;
const DEFAULT_DUTY = 0.5;
/** A chunk slowed by something else (a stalled disk) does not make the pass sleep longer. */
const MAX_REST_MS = 1000;

/** A policy with its defaults filled in; throws a RangeError saying what is wrong. */
export function retentionPolicy(p: RetentionPolicy): Required<RetentionPolicy> {
  const eventsMs = p.eventsMs === undefined ? p.roomsMs : p.eventsMs;
  if (!(p.roomsMs > 0)) throw new RangeError('the rooms horizon must be positive');
  if (eventsMs !== null && eventsMs < p.roomsMs)
    throw new RangeError('events of no room must be kept at least as long as rooms');
  const duty = p.duty ?? DEFAULT_DUTY;
  if (!(duty > 0 && duty <= 1)) throw new RangeError('duty must be above 0 and at most 1');
  return {
    archiveDir: p.archiveDir ?? null,
    duty,
    roomsMs: p.roomsMs,
    eventsMs,
    everyMs: p.everyMs ?? Math.min(600_000, Math.max(10_000, Math.round(p.roomsMs / 10))),
    chunkRooms: p.chunkRooms ?? DEFAULT_CHUNK_ROOMS,
  };
}

export class Retention {
  private readonly policy: Required<RetentionPolicy> | null;
  private timer: Timer | null = null;
  private running: { pass: RetentionPass; done: Promise<RetentionPass> } | null = null;
  private last: RetentionPass | null = null;
  private lastByOperator: RetentionPass | null = null;
  private readonly stopping = new AbortController();
  private readonly totals = { passes: 0, rooms: 0, events: 0, otherEvents: 0 };

  constructor(
    private readonly journal: Pick<JournalStore, 'prune'>,
    policy: RetentionPolicy | null,
    private readonly log: Logger,
    private readonly clock: Clock,
    /** Where the archive is written (the simulator's is in memory, with faults). */
    private readonly files: Files = nodeFiles,
  ) {
    this.policy = policy === null ? null : retentionPolicy(policy);
  }

  /** Starts the schedule (nothing without a policy); the first pass runs at once. */
  start(): void {
    const policy = this.policy;
    if (policy === null || this.timer !== null) return;
    const pass = () => {
      if (this.running === null) this.pass(policy, 'schedule').done.catch(() => {});
    };
    this.timer = this.clock.setInterval(pass, policy.everyMs).unref();
    pass();
  }

  /** Stops the schedule and the pass in flight (between chunks); resolves once it stopped. */
  async stop(): Promise<void> {
    this.clock.clear(this.timer);
    this.stopping.abort();
    await this.running?.done.catch(() => {});
  }

  /**
   * A pass now, with these horizons: the operator's. Refused (null) while one runs; its
   * status says how far that one got.
   */
  runNow(p: RetentionPolicy): RetentionPass | null {
    if (this.running !== null || this.stopping.signal.aborted) return null;
    // An operator's pass archives where this control plane's own passes do (serve --archive).
    const archiveDir =
      p.archiveDir === undefined ? (this.policy?.archiveDir ?? null) : p.archiveDir;
    const { pass, done } = this.pass(retentionPolicy({ ...p, archiveDir }), 'operator');
    done.catch(() => {});
    return pass;
  }

  status(): RetentionStatus {
    return {
      policy: this.policy,
      running: this.running ? structuredClone(this.running.pass) : null,
      last: this.last,
      lastByOperator: this.lastByOperator,
      totals: { ...this.totals },
    };
  }

  private pass(
    policy: Required<RetentionPolicy>,
    by: RetentionPass['by'],
  ): { pass: RetentionPass; done: Promise<RetentionPass> } {
    const now = this.clock.now();
    const t0 = this.clock.monotonic();
    const cutoffTs = now - policy.roomsMs;
    const eventsCutoffTs = policy.eventsMs === null ? null : now - policy.eventsMs;
    const pass: RetentionPass = {
      by,
      startedAt: now,
      ms: null,
      error: null,
      result: {
        cutoffTs,
        eventsCutoffTs,
        rooms: 0,
        events: 0,
        otherEvents: 0,
        batches: 0,
        archived: policy.archiveDir !== null,
      },
    };
    // Since the last chunk began: how long the writer just spent on retention.
    let mark = t0;
    const pause = async () => {
      const spent = this.clock.monotonic() - mark;
      const rest = Math.min(MAX_REST_MS, (spent * (1 - policy.duty)) / policy.duty);
      if (rest >= 1) await new Promise<void>((r) => this.clock.setTimeout(r, rest));
      mark = this.clock.monotonic();
    };
    const done = (async () => {
      try {
        const dir = policy.archiveDir;
        pass.result = await this.journal.prune({
          pause,
          ...(dir === null
            ? {}
            : { archive: (chunk) => archiveChunk(dir, chunk, this.clock.now(), this.files) }),
          cutoffTs,
          ...(eventsCutoffTs === null ? {} : { eventsCutoffTs }),
          chunkRooms: policy.chunkRooms,
          signal: this.stopping.signal,
          onChunk: (sofar) => {
            pass.result = sofar;
          },
        });
      } catch (err) {
        pass.error = (err as Error).message;
        this.log.warn({ err, by }, 'journal retention pass failed; the next one tries again');
      }
      pass.ms = Math.round(this.clock.monotonic() - t0);
      const r = pass.result;
      this.totals.passes++;
      this.totals.rooms += r.rooms;
      this.totals.events += r.events;
      this.totals.otherEvents += r.otherEvents;
      if (r.rooms + r.otherEvents > 0 || by === 'operator')
        this.log.info(
          { by, rooms: r.rooms, events: r.events, otherEvents: r.otherEvents, ms: pass.ms },
          'journal retention pass',
        );
      this.last = pass;
      if (by === 'operator') this.lastByOperator = pass;
      this.running = null;
      if (pass.error !== null) throw new Error(pass.error);
      return pass;
    })();
    this.running = { pass, done };
    return this.running;
  }
}
