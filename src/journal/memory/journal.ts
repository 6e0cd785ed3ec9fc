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
 *   committed is on the disk for the next `MemoryJournal.open`.
 */

import type { Logger } from '../../log.ts';
import { silentLogger } from '../../log.ts';
import { type Clock, systemClock } from '../../ports/clock.ts';
import type { Ids } from '../../ports/ids.ts';
import { checkAfterSeq, checkCursor, checkPrune } from '../checks.ts';
import { CommitQueue, type Outcome } from '../commit-queue.ts';
import { JournalError } from '../errors.ts';
import type { EventInput, PendingEvent } from '../events.ts';
import type {
  AppendResult,
  EventListener,
  JournalHealth,
  JournalStore,
  PruneResult,
  Subscription,
} from '../store.ts';
import { SubscriptionHub } from '../subscriptions.ts';
import type { MemoryDisk } from './disk.ts';
import { MemoryReader, prunable } from './reader.ts';

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
}

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

  private constructor(options: MemoryJournalOptions) {
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

  /** Opens the journal on `disk`; JOURNAL_BUSY while another journal writes it. */
  static open(options: MemoryJournalOptions): MemoryJournal {
    const { disk } = options;
    if (disk.writer !== null)
      throw new JournalError(
        'JOURNAL_BUSY',
        `journal ${disk.name} has a writer already; one writer at a time`,
      );
    const fixed = options.commitMs;
    if (typeof fixed === 'number' && !(Number.isFinite(fixed) && fixed >= 0))
      throw new RangeError(`commitMs must be a number of ms ≥ 0, got ${fixed}`);
    const journal = new MemoryJournal(options);
    disk.writer = journal;
    return journal;
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
    this.close();
  }

  private commit(events: PendingEvent[]): Promise<Outcome[]> {
    const apply = (): Outcome[] => {
      if (this.refused !== null)
        throw new JournalError(
          'JOURNAL_WRITE_FAILED',
          `journal ${this.disk.name} refused the commit: ${this.refused}`,
        );
      return this.disk.commit(events);
    };
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

  async prune(opts: { cutoffTs: number; chunkRooms?: number }): Promise<PruneResult> {
    const chunkRooms = checkPrune(opts);
    this.live();
    const rooms = prunable(this.disk, opts.cutoffTs).map((r) => r.room);
    const result: PruneResult = { cutoffTs: opts.cutoffTs, rooms: 0, events: 0, batches: 0 };
    for (let i = 0; i < rooms.length; i += chunkRooms) {
      const chunk = rooms.slice(i, i + chunkRooms);
      result.events += this.disk.deleteRooms(chunk);
      result.rooms += chunk.length;
      result.batches++;
    }
    await this.queue.recordPruned(opts.cutoffTs, result);
    return result;
  }

  health(): JournalHealth {
    return { state: this.queue.state, ...this.queue.health(), writerRestarts: 0, term: null };
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

  /** Stops at once: queued appends are rejected; the disk is free for another writer. */
  override close(): void {
    this.queue.close();
    this.hub.closeAll();
    if (this.disk.writer === this) this.disk.writer = null;
  }

  private live(): void {
    if (this.queue.state !== 'ready')
      throw new JournalError('JOURNAL_CLOSED', `journal ${this.disk.name} is ${this.queue.state}`);
  }
}
