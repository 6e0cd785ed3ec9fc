/**
 * The in-memory journal (issue 41): the journal's whole contract — group commit, rejection
 * records, idempotent event ids, subscriptions, cursors, retention, queries — over a `MemoryDisk`,
 * for the simulator and for tests that need a journal and not SQLite. What a simulated run does
 * to a journal, it does here:
 *
 * - **commit latency**: each transaction commits `commitMs` after it was handed over, on the
 *   journal's `Clock` (a `VirtualClock` in the simulator);
 * - **refused writes**, as on a full disk (`refuseWrites`): commits fail whole with
 *   JOURNAL_WRITE_FAILED, nothing half-applied, until the fault is lifted;
 * - **a crash** (`crash`): the journal stops at once; what was still committing is lost, what
 *   committed is on the disk for the next `MemoryJournal.open`;
 * - **a leader change** (`lead`): control planes take turns on one disk as on PostgreSQL
 *   (leadership.ts) — a standby (`MemoryJournal.standBy`) leads once the leader closed, crashed
 *   or stopped renewing its lease, and the old leader's commits are refused from then on
 *   (`JOURNAL_FENCED`, and `onDeposed` listeners hear it once).
 */

import { checkAfterSeq, checkCursor, checkPrune } from '../../journal/checks.ts';
import { CommitQueue } from '../../journal/commit-queue.ts';
import type { Outcome } from '../../journal/decide.ts';
import { JournalError } from '../../journal/errors.ts';
import type { MemoryDisk } from '../../journal/memory/disk.ts';
import type { TakeoverHow } from '../../journal/memory/leadership.ts';
import { MEMORY_SCHEMA_VERSION, MemoryReader } from '../../journal/memory/reader.ts';
import { pruneInChunks } from '../../journal/prune.ts';
import type {
  AppendResult,
  CheckpointInput,
  EventListener,
  JournalHealth,
  JournalStore,
  PruneOptions,
  PruneResult,
  Subscription,
} from '../../journal/store.ts';
import { SubscriptionHub } from '../../journal/subscriptions.ts';
import type { Logger } from '../../log.ts';
import { silentLogger } from '../../log.ts';
import { type Clock, systemClock } from '../../ports/clock.ts';
import type { Ids } from '../../ports/ids.ts';
import type { EventInput, PendingEvent } from '../../room/events.ts';

export interface MemoryJournalOptions {
  disk: MemoryDisk;
  /**
   * How long a transaction takes to commit, in ms of `clock`: a number, or a function drawn once
   * per transaction (a disk whose fsync varies). Default 0: at once.
   */
  commitMs?: number | (() => number);
  clock?: Clock;
  /** Names events appended without an id. Default: the process's ids. */
  ids?: Ids;
  /** Most events in one transaction. Default 4096. */
  maxBatch?: number;
  logger?: Logger;
  /**
   * Lead the disk as `holder` under a lease of `leaseMs` (default 2000), renewed every third of
   * it on `clock`, as control planes do on a PostgreSQL journal. Without it the journal writes
   * with no term, alone.
   */
  lead?: { holder: string; leaseMs?: number };
}

/** The term this journal writes under, and how it came to it. */
export interface MemoryLeadershipTerm {
  term: number;
  holder: string;
  how: TakeoverHow;
  previous: string | null;
}

const DEFAULT_LEASE_MS = 2000;

export class MemoryJournal extends MemoryReader implements JournalStore {
  private readonly hub: SubscriptionHub;
  private readonly queue: CommitQueue;
  private readonly clock: Clock;
  private readonly commitMs: () => number;
  private refused: string | null = null;
  /** Commits waiting out their latency: a crash drops them. */
  private readonly committing = new Set<{
    timer: ReturnType<Clock['setTimeout']>;
    fail: (e: unknown) => void;
  }>();
  private drained: Promise<void> | null = null;
  private deposedBy: string | null = null;
  private readonly deposedListeners: Array<(why: string) => void> = [];
  private renewTimer: ReturnType<Clock['setInterval']> | null = null;

  private constructor(
    options: MemoryJournalOptions,
    /** The term it leads under; null without `lead`. */
    readonly leadership: MemoryLeadershipTerm | null,
  ) {
    super(options.disk);
    const log = options.logger ?? silentLogger;
    this.clock = options.clock ?? systemClock;
    const commitMs = options.commitMs ?? 0;
    this.commitMs = typeof commitMs === 'number' ? () => commitMs : commitMs;
    this.hub = new SubscriptionHub(
      (afterSeq, limit) => this.disk.readFrom(afterSeq, limit),
      (err, ev) =>
        log.error({ err, seq: ev.seq }, 'journal subscriber threw; it keeps receiving events'),
      this.clock,
    );
    this.queue = new CommitQueue(
      {
        committer: { ready: true, commit: (events) => this.commit(events) },
        maxBatch: options.maxBatch ?? 4096,
        maxInFlight: 1,
        hub: this.hub,
        log,
        where: options.disk.name,
        clock: this.clock,
        ...(options.ids ? { ids: options.ids } : {}),
      },
      options.disk.headSeq(),
    );
  }

  /**
   * Opens the journal on `disk`; JOURNAL_BUSY while another journal writes it (with `lead`: while
   * another leads it and renews its lease).
   */
  static open(options: MemoryJournalOptions): MemoryJournal {
    const { disk, lead } = options;
    const fixed = options.commitMs;
    if (typeof fixed === 'number' && !(Number.isFinite(fixed) && fixed >= 0))
      throw new RangeError(`commitMs must be a number of ms ≥ 0, got ${fixed}`);
    const row = disk.leadership.row;
    if (disk.writer !== null && (lead === undefined || row.holder === null))
      throw new JournalError(
        'JOURNAL_BUSY',
        `journal ${disk.name} has a writer already; one writer at a time`,
      );
    let leadership: MemoryLeadershipTerm | null = null;
    if (lead) {
      const leaseMs = lead.leaseMs ?? DEFAULT_LEASE_MS;
      if (!(Number.isInteger(leaseMs) && leaseMs > 0))
        throw new RangeError(`leaseMs must be a whole number of ms > 0, got ${leaseMs}`);
      const now = (options.clock ?? systemClock).now();
      // A frozen leader's hold ends with its lease: its commits are refused from now on.
      const got = disk.leadership.tryLead(lead.holder, leaseMs, now, disk.writer !== null);
      if (!got.ok)
        throw new JournalError(
          'JOURNAL_BUSY',
          `journal ${disk.name} is led by ${got.current.holder} (term ${got.current.term}, lease ${got.current.leaseUntil - now} ms left); run this one as its standby, or stop that one first`,
        );
      leadership = { term: got.term, holder: lead.holder, how: got.how, previous: got.previous };
    }
    const journal = new MemoryJournal(options, leadership);
    disk.writer = journal;
    if (lead) journal.renewEvery(lead.leaseMs ?? DEFAULT_LEASE_MS);
    return journal;
  }

  /**
   * A standby: waits, trying every `pollMs` (default a quarter of the lease), until it leads the
   * disk; `onWaiting` hears whom it waits for, once.
   */
  static async standBy(
    options: MemoryJournalOptions & { lead: { holder: string; leaseMs?: number } },
    wait: { pollMs?: number; onWaiting?: (why: string) => void } = {},
  ): Promise<MemoryJournal> {
    const clock = options.clock ?? systemClock;
    const pollMs = wait.pollMs ?? (options.lead.leaseMs ?? DEFAULT_LEASE_MS) / 4;
    let told = false;
    for (;;) {
      try {
        return MemoryJournal.open(options);
      } catch (err) {
        if (!(err instanceof JournalError) || err.code !== 'JOURNAL_BUSY') throw err;
        if (!told) wait.onWaiting?.(err.message);
        told = true;
      }
      await new Promise<void>((resolve) => clock.setTimeout(() => resolve(), pollMs));
    }
  }

  private renewEvery(leaseMs: number): void {
    this.renewTimer = this.clock.setInterval(() => {
      const term = this.leadership?.term ?? 0;
      if (this.queue.state === 'closed' || this.deposedBy !== null) return;
      if (!this.disk.leadership.renew(term, leaseMs, this.clock.now()))
        this.depose('a newer term took the journal');
    }, leaseMs / 3);
    this.renewTimer.unref();
  }

  private depose(why: string): void {
    if (this.deposedBy !== null) return;
    this.deposedBy = why;
    for (const l of this.deposedListeners) l(why);
  }

  /** Called once, when another journal has taken the disk's leadership from this one. */
  onDeposed(listener: (why: string) => void): void {
    this.deposedListeners.push(listener);
    if (this.deposedBy !== null) listener(this.deposedBy);
  }

  private fencedError(): JournalError {
    return new JournalError(
      'JOURNAL_FENCED',
      `this control plane no longer leads ${this.disk.name} (term ${this.leadership?.term}: ${this.deposedBy}); its appends are refused`,
    );
  }

  /** Whether its term is still the disk's; deposes it when not. */
  private leads(): boolean {
    if (this.leadership === null) return true;
    if (this.deposedBy === null && this.disk.leadership.row.term !== this.leadership.term)
      this.depose('a newer term took the journal');
    return this.deposedBy === null;
  }

  /** Commits fail whole with JOURNAL_WRITE_FAILED and `why` (as on a full disk); null: they work. */
  refuseWrites(why: string | null): void {
    this.refused = why;
  }

  /**
   * The process holding the journal dies: appends not yet committed are lost (their callers hear
   * JOURNAL_CLOSED, as a dead process's would hear nothing), the disk keeps what committed, and
   * the writer is free for the next open.
   */
  crash(): void {
    for (const c of this.committing) {
      this.clock.clear(c.timer);
      c.fail(new JournalError('JOURNAL_CLOSED', `journal ${this.disk.name} crashed`));
    }
    this.committing.clear();
    this.stop(false);
  }

  private commit(events: PendingEvent[]): Promise<Outcome[]> {
    const apply = (): Outcome[] => {
      if (!this.leads()) throw this.fencedError();
      if (this.refused !== null)
        throw new JournalError(
          'JOURNAL_WRITE_FAILED',
          `journal ${this.disk.name} refused the commit: ${this.refused}`,
        );
      const outcomes = this.disk.commit(events);
      if (this.leadership !== null)
        this.disk.leadership.wrote(this.leadership.term, outcomes.filter((o) => o[0] <= 1).length);
      return outcomes;
    };
    // A deposed leader's commits are refused at once, as its lost session's would be.
    if (this.deposedBy !== null) return Promise.reject(this.fencedError());
    const ms = this.commitMs();
    if (ms === 0) {
      try {
        return Promise.resolve(apply());
      } catch (err) {
        return Promise.reject(err);
      }
    }
    return new Promise((resolve, reject) => {
      const entry = {
        timer: this.clock.setTimeout(() => {
          this.committing.delete(entry);
          try {
            resolve(apply());
          } catch (err) {
            reject(err);
          }
        }, ms),
        fail: reject,
      };
      this.committing.add(entry);
    });
  }

  append(input: EventInput): Promise<AppendResult> {
    return this.queue.enqueue(input, false);
  }

  subscribe(afterSeq: number, listener: EventListener): Subscription {
    checkAfterSeq(afterSeq);
    return this.hub.subscribe(afterSeq, listener);
  }

  getCursor(name: string): Promise<number | null> {
    return Promise.resolve(this.disk.consumers.get(name)?.seq ?? null);
  }

  setCheckpoint(checkpoint: CheckpointInput): Promise<void> {
    try {
      this.live();
    } catch (err) {
      return Promise.reject(err);
    }
    const writtenAt = this.clock.now();
    const stored = { ...checkpoint, schemaVersion: MEMORY_SCHEMA_VERSION, writtenAt };
    this.disk.checkpoints.set(checkpoint.name, stored);
    return Promise.resolve();
  }

  setCursor(name: string, seq: number): Promise<void> {
    try {
      checkCursor(name, seq);
      this.live();
    } catch (err) {
      return Promise.reject(err);
    }
    this.disk.consumers.set(name, { seq, updatedAt: this.clock.now() });
    return Promise.resolve();
  }

  async prune(opts: PruneOptions): Promise<PruneResult> {
    const chunkRooms = checkPrune(opts);
    const { disk } = this;
    return pruneInChunks(
      { ...opts, chunkRooms },
      {
        // Each chunk on a turn of its own, as a writer's transaction: appends commit between.
        rooms: async (cutoffTs, limit) => {
          await this.turn();
          this.live();
          const rooms = disk.prunable(cutoffTs).slice(0, limit);
          return { rooms: rooms.length, events: disk.deleteRooms(rooms.map((r) => r.room)) };
        },
        others: async (cutoffTs, limit) => {
          await this.turn();
          this.live();
          return disk.deleteOthers(cutoffTs, limit);
        },
        archiving: {
          pickRooms: (cutoffTs, limit) =>
            Promise.resolve({ chunk: disk.pickRooms(cutoffTs, limit), upToSeq: disk.lastSeq }),
          deleteRooms: async (names, upToSeq) => {
            await this.turn();
            this.live();
            return disk.deleteRoomsUpTo(names, upToSeq);
          },
          pickOthers: (cutoffTs, limit) => Promise.resolve(disk.pickOthers(cutoffTs, limit)),
          deleteEvents: async (seqs) => {
            await this.turn();
            this.live();
            return disk.deleteSeqs(seqs);
          },
        },
      },
      (r) => this.queue.recordPruned(r),
    );
  }

  private turn(): Promise<void> {
    return new Promise((resolve) => this.clock.defer(resolve));
  }

  health(): JournalHealth {
    return {
      state: this.queue.state,
      ...this.queue.health(),
      writerRestarts: 0,
      term: this.leadership?.term ?? null,
    };
  }

  /** Finishes every append already accepted (at most `timeoutMs`), then closes. */
  drain(options: { timeoutMs?: number } = {}): Promise<void> {
    if (this.drained) return this.drained;
    this.drained = (async () => {
      await this.queue.drain(options.timeoutMs ?? 10_000);
      this.close();
    })();
    return this.drained;
  }

  /**
   * Stops at once: queued appends are rejected; the disk is free for another writer (a leader
   * hands over at once: it resigns).
   */
  override close(): void {
    this.stop(true);
  }

  private stop(resign: boolean): void {
    this.queue.close();
    this.hub.closeAll();
    this.clock.clear(this.renewTimer);
    if (resign && this.leadership !== null && this.deposedBy === null)
      this.disk.leadership.resign(this.leadership.term);
    if (this.disk.writer === this) this.disk.writer = null;
  }

  private live(): void {
    if (this.queue.state !== 'ready')
      throw new JournalError('JOURNAL_CLOSED', `journal ${this.disk.name} is ${this.queue.state}`);
  }
}
