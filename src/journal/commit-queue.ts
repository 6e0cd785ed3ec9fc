/**
 * Group commit, shared by every backend: appends that arrive in one event-loop turn share one
 * transaction; while a transaction commits, new appends gather into the next one. A backend
 * supplies only `commit(batch) → outcomes`; this module validates, queues, acknowledges after
 * COMMIT, publishes to subscribers, counts and logs failures, and waits for idleness on drain.
 */
import { hop, hopsOn } from '../hops.ts';
import type { Logger } from '../log.ts';
import { type Clock, systemClock } from '../ports/clock.ts';
import { type Ids, systemIds } from '../ports/ids.ts';
import { RoomError } from '../room/errors.ts';
import {
  CREATED_REPEATED_KEYS,
  type EventData,
  type JournalEvent,
  type PendingEvent,
  validateEvent,
} from '../room/events.ts';
import type { RejectReason } from '../room/reducer.ts';
import { type RoomState, resolveDeadlines } from '../room/states.ts';
import { type Outcome, rejectionData } from './decide.ts';
import { JournalError } from './errors.ts';
import type { AppendResult, JournalHealth, PruneResult } from './store.ts';
import type { SubscriptionHub } from './subscriptions.ts';

export interface BatchCommitter {
  /** False while the backend cannot take a batch (a writer thread restarting, say). */
  readonly ready: boolean;
  /**
   * Commits the batch in one transaction; rejects (nothing committed) when it cannot. `fence`
   * moves past a batch's each time one fails: a committer that takes a second batch before the
   * first has settled must refuse, not commit, a batch whose fence is at or below one that failed.
   * It was handed over before the failure was known and may depend on what failed (an engine's
   * transfer_posted behind its prefill_started); committing it would put the room's events out of
   * order for good.
   */
  commit(events: PendingEvent[], fence: number): Promise<Outcome[]>;
}

export interface CommitQueueOptions {
  committer: BatchCommitter;
  /** Most events in one transaction. */
  maxBatch: number;
  /** Transactions handed over and not yet settled; 2 lets one commit while the next is prepared. */
  maxInFlight: number;
  hub: SubscriptionHub;
  log: Logger;
  /** Where the journal is, for messages (a file path or a redacted URL). */
  where: string;
  /** Stamps events and paces flushes. Default: the process's clock. */
  clock?: Clock;
  /** Names events appended without an id. Default: the process's ids. */
  ids?: Ids;
}

interface Waiting {
  ev: PendingEvent;
  resolve: (r: AppendResult) => void;
  reject: (e: unknown) => void;
}

export type QueueState = 'ready' | 'draining' | 'closed';

export class CommitQueue {
  state: QueueState = 'ready';
  private readonly o: CommitQueueOptions;
  private queue: Waiting[] = [];
  /** Batches handed to the committer and not yet settled, and the events in them. */
  private inFlight = 0;
  private inFlightEvents = 0;
  private flushScheduled = false;
  /** The fence batches are handed over with (BatchCommitter.commit): moved past each failed one. */
  private fence = 0;
  private writable = true;
  /** Failed commits not logged one by one (a full disk fails every commit): counted, summarized. */
  private failuresUnlogged = 0;
  private failureLoggedAt = 0;
  private failedSince = 0;
  private lastError: string | null = null;
  private committedSeq: number;
  private commits = 0;
  private lastBatchSize = 0;
  private readonly idleWaiters: Array<() => void> = [];
  private readonly clock: Clock;
  private readonly ids: Ids;

  constructor(options: CommitQueueOptions, headSeq: number) {
    this.o = options;
    this.committedSeq = headSeq;
    this.clock = options.clock ?? systemClock;
    this.ids = options.ids ?? systemIds;
  }

  /** Validates and queues one event; resolves once its transaction has committed. */
  enqueue(input: unknown, internal: boolean): Promise<AppendResult> {
    if (this.state !== 'ready') {
      return Promise.reject(
        new JournalError('JOURNAL_CLOSED', `journal ${this.o.where} is ${this.state}`),
      );
    }
    let ev: PendingEvent;
    try {
      ev = validateEvent(input, { internal, clock: this.clock, ids: this.ids });
    } catch (err) {
      // The room's word for it, said as the journal's: callers branch on JOURNAL_INVALID_EVENT.
      const said =
        err instanceof RoomError ? new JournalError('JOURNAL_INVALID_EVENT', err.message) : err;
      return Promise.reject(said);
    }
    if (ev.type === 'room.created') ev.data = createdAsStored(ev.data);
    hop('queued', ev.type, ev.room);
    return new Promise((resolve, reject) => {
      this.queue.push({ ev, resolve, reject });
      this.kick();
    });
  }

  /** Flushes on the next turn if there is work and room for it (also: a writer is back). */
  kick(): void {
    if (this.flushScheduled || this.inFlight >= this.o.maxInFlight) return;
    this.flushScheduled = true;
    this.clock.defer(() => {
      this.flushScheduled = false;
      this.flush();
    });
  }

  private flush(): void {
    // The whole queue is one transaction (up to maxBatch): appends of one turn commit together.
    // While the committer is not ready, whoever makes it ready again kicks the queue.
    const c = this.o.committer;
    while (this.queue.length > 0 && this.inFlight < this.o.maxInFlight && c.ready) {
      const size = Math.min(this.o.maxBatch, this.queue.length);
      const batch = size === this.queue.length ? this.queue : this.queue.slice(0, size);
      this.queue = size === this.queue.length ? [] : this.queue.slice(size);
      this.inFlight++;
      this.inFlightEvents += batch.length;
      if (hopsOn) for (const w of batch) hop('to-writer', w.ev.type, w.ev.room);
      const fence = this.fence;
      c.commit(
        batch.map((w) => w.ev),
        fence,
      ).then(
        (outcomes) => this.settle(batch, outcomes),
        (err) => this.fail(batch, err, fence),
      );
    }
    this.notifyIdle();
  }

  private settle(batch: Waiting[], outcomes: Outcome[]): void {
    if (hopsOn) for (const w of batch) hop('settled', w.ev.type, w.ev.room);
    this.inFlight--;
    this.inFlightEvents -= batch.length;
    if (!this.writable) {
      this.o.log.warn(
        { failedForMs: this.clock.now() - this.failedSince, failedCommits: this.failuresUnlogged },
        'journal writable again',
      );
      this.failuresUnlogged = 0;
    }
    this.writable = true;
    this.lastError = null;
    this.commits++;
    this.lastBatchSize = batch.length;
    const results: AppendResult[] = new Array(batch.length);
    const publish = this.o.hub.size > 0 ? ([] as JournalEvent[]) : null;
    for (let i = 0; i < batch.length; i++) {
      const { ev } = batch[i] as Waiting;
      const o = outcomes[i] as Outcome;
      if (o[0] === 0) {
        results[i] = {
          status: 'applied',
          seq: o[1],
          eventId: ev.eventId,
          state: o[2] as RoomState | null,
        };
        publish?.push({ ...ev, seq: o[1] });
      } else if (o[0] === 1) {
        results[i] = {
          status: 'rejected',
          seq: o[1],
          eventId: ev.eventId,
          reason: o[2] as RejectReason,
          state: o[3] as RoomState | null,
          detail: o[4],
        };
        publish?.push({
          ...ev,
          seq: o[1],
          type: 'room.event_rejected',
          data: rejectionData(ev, o[2], o[3]),
        });
      } else if (o[0] === 3) {
        results[i] = {
          status: 'rejected',
          seq: o[1],
          eventId: ev.eventId,
          reason: 'event_id_conflict',
          state: null,
          detail: o[2],
        };
      } else {
        results[i] = {
          status: 'duplicate',
          seq: o[1],
          eventId: ev.eventId,
          original: o[2] ? 'rejected' : 'applied',
        };
      }
      if (o[0] < 2 && o[1] > this.committedSeq) this.committedSeq = o[1];
    }
    if (publish && publish.length > 0) this.o.hub.publish(publish);
    const resolve = (from: number, to: number) => {
      for (let i = from; i < to; i++) (batch[i] as Waiting).resolve(results[i] as AppendResult);
    };
    // Never flush straight from here: an inline writer settles in a microtask, and a direct
    // flush would chain commits without ever returning to the event loop.
    this.kick();
    if (this.o.maxInFlight > 1 && batch.length >= 64) {
      // Acknowledge in two turns, the second after the next flush. Callers that append again
      // once acknowledged (engines do) then fill two transactions, and the writer thread
      // commits one while this thread prepares the other, instead of the two taking turns.
      const half = batch.length >> 1;
      resolve(0, half);
      this.clock.defer(() => resolve(half, batch.length));
    } else {
      resolve(0, batch.length);
    }
  }

  private fail(batch: Waiting[], err: unknown, fence: number): void {
    if (fence >= this.fence) this.fence = fence + 1;
    this.inFlight--;
    this.inFlightEvents -= batch.length;
    const now = this.clock.now();
    if (this.writable) this.failedSince = now;
    const message = (err as Error).message;
    // The first failure, another error, then at most one line per 5 s while it lasts.
    if (message !== this.lastError || now - this.failureLoggedAt >= 5000) {
      this.o.log.error(
        { err, events: batch.length, failedCommitsNotLogged: this.failuresUnlogged },
        'journal commit failed; its appends are rejected',
      );
      this.failureLoggedAt = now;
      this.failuresUnlogged = 0;
    } else this.failuresUnlogged++;
    this.writable = false;
    this.lastError = message;
    for (const w of batch) w.reject(err);
    // Appends queued behind it were made before the failure was known, and may depend on what
    // failed: they are refused too (retryable, as it is), never committed without it.
    const behind = this.queue.splice(0);
    if (behind.length > 0) {
      const e = JournalError.from(err);
      const refused = new JournalError(
        e.code,
        `not committed: a commit queued before it failed (${e.message}); retry it with the same eventId`,
      );
      for (const w of behind) w.reject(refused);
    }
    this.kick();
  }

  private notifyIdle(): void {
    if (this.inFlight > 0 || this.queue.length > 0) return;
    for (const w of this.idleWaiters.splice(0)) w();
  }

  /** Journals a prune that deleted anything (`journal.pruned`, from `retention`), every backend alike. */
  async recordPruned(p: PruneResult): Promise<void> {
    if (p.rooms === 0 && p.otherEvents === 0) return;
    const others =
      p.eventsCutoffTs === null
        ? {}
        : { eventsCutoffTs: p.eventsCutoffTs, otherEvents: p.otherEvents };
    await this.enqueue(
      {
        type: 'journal.pruned',
        source: 'retention',
        data: {
          cutoffTs: p.cutoffTs,
          rooms: p.rooms,
          events: p.events,
          ...others,
          ...(p.archived ? { archived: true } : {}),
        },
      },
      true,
    );
  }

  health(): Omit<JournalHealth, 'state' | 'writerRestarts' | 'term'> {
    return {
      writable: this.writable,
      lastError: this.lastError,
      pending: this.queue.length + this.inFlightEvents,
      committedSeq: this.committedSeq,
      commits: this.commits,
      lastBatchSize: this.lastBatchSize,
    };
  }

  /**
   * Refuses new appends and waits for those accepted to settle: true once idle, false when
   * `timeoutMs` passed first (what is left stays queued; `close` rejects it).
   */
  async drain(timeoutMs: number): Promise<boolean> {
    if (this.state === 'ready') this.state = 'draining';
    if (this.inFlight === 0 && this.queue.length === 0) return true;
    let timer: ReturnType<Clock['setTimeout']> | undefined;
    const idle = await Promise.race([
      new Promise<true>((resolve) => {
        this.idleWaiters.push(() => resolve(true));
        this.kick();
      }),
      new Promise<false>((resolve) => {
        timer = this.clock.setTimeout(() => resolve(false), timeoutMs);
      }),
    ]);
    this.clock.clear(timer);
    if (!idle) {
      this.o.log.error(
        { pending: this.queue.length + this.inFlightEvents, timeoutMs },
        'journal drain timed out; closing with appends uncommitted',
      );
    }
    return idle;
  }

  /** Stops at once: appends still queued are rejected with JOURNAL_CLOSED. */
  close(): void {
    this.state = 'closed';
    const err = new JournalError('JOURNAL_CLOSED', `journal ${this.o.where} was closed`);
    for (const w of this.queue.splice(0)) w.reject(err);
    for (const w of this.idleWaiters.splice(0)) w();
  }
}

const REPEATED: ReadonlySet<string> = new Set(CREATED_REPEATED_KEYS);

/**
 * A `room.created`'s data as it is stored: with the full deadline table, so that replay never
 * depends on this build's defaults, and the keys rooms repeat last (CREATED_REPEATED_KEYS).
 */
function createdAsStored(data: EventData<'room.created'>): EventData<'room.created'> {
  const full: Record<string, unknown> = {
    ...data,
    deadlinesMs: resolveDeadlines(data.deadlinesMs),
  };
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(full)) if (!REPEATED.has(key)) out[key] = value;
  for (const key of CREATED_REPEATED_KEYS) if (full[key] !== undefined) out[key] = full[key];
  return out as EventData<'room.created'>;
}
