/**
 * The SQLite journal store: group commit on the main thread, commits by a writer (writers.ts),
 * reads on a read-only connection. Appends that arrive in one event-loop turn share one
 * transaction; while a transaction is committing, new appends gather into the next one.
 */
import { existsSync, mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import type { Logger } from '../../log.ts';
import { silentLogger } from '../../log.ts';
import { JournalError } from '../errors.ts';
import { type EventInput, type JournalEvent, type PendingEvent, validateEvent } from '../events.ts';
import type { RejectReason } from '../reducer.ts';
import { type RoomState, resolveDeadlines } from '../states.ts';
import type {
  AppendResult,
  Durability,
  EventListener,
  JournalHealth,
  JournalStore,
  PruneResult,
  Subscription,
} from '../store.ts';
import { SubscriptionHub } from '../subscriptions.ts';
import { type Outcome, rejectionData } from './batch-writer.ts';
import { DEFAULT_DURABILITY } from './open.ts';
import { SqliteReader } from './reader.ts';
import { acquireWriterLock, type WriterLock } from './writer-lock.ts';
import type { WriterInit } from './writer-protocol.ts';
import { startWriter, type Writer } from './writers.ts';

export interface SqliteJournalOptions {
  path: string;
  /** Default `power`; see docs/journal.md, "Durability". */
  durability?: Durability;
  /** Create the file when missing. Default true. */
  create?: boolean;
  /** Most events in one transaction. Default 4096 at `power`, 256 at `process` (inline commits block the loop). */
  maxBatch?: number;
  /** Rooms kept in the writer's memory. Default 50 000. */
  roomCacheSize?: number;
  /** Append `journal.opened` with this source once open. Default: none. */
  announce?: { source: string; version: string };
  logger?: Logger;
}

interface Waiting {
  ev: PendingEvent;
  resolve: (r: AppendResult) => void;
  reject: (e: unknown) => void;
}

export class SqliteJournal extends SqliteReader implements JournalStore {
  private readonly writer: Writer;
  private readonly maxBatch: number;
  private readonly log: Logger;
  private readonly hub: SubscriptionHub;
  private queue: Waiting[] = [];
  /** Batches handed to the writer and not yet settled, and the events in them. */
  private inFlight = 0;
  private inFlightEvents = 0;
  /** 2 for a writer thread: one batch commits while the next is prepared (pipelining). */
  private readonly maxInFlight: number;
  private flushScheduled = false;
  private state: JournalHealth['state'] = 'starting';
  private writable = true;
  /** Failed commits not logged one by one (a full disk fails every commit): counted, summarized. */
  private failuresUnlogged = 0;
  private failureLoggedAt = 0;
  private failedSince = 0;
  private lastError: string | null = null;
  private committedSeq = 0;
  private commits = 0;
  private lastBatchSize = 0;
  private drained: Promise<void> | null = null;
  private readonly idleWaiters: Array<() => void> = [];

  private constructor(
    options: SqliteJournalOptions,
    writer: Writer,
    headSeq: number,
    log: Logger,
    private readonly lock: WriterLock,
  ) {
    super(options.path);
    this.writer = writer;
    // An inline writer blocks the event loop for the length of a batch: keep batches shorter there.
    this.maxBatch = options.maxBatch ?? (writer.kind === 'inline' ? 256 : 4096);
    this.maxInFlight = writer.kind === 'inline' ? 1 : 2;
    this.log = log;
    this.committedSeq = headSeq;
    this.hub = new SubscriptionHub(
      (afterSeq, limit) => this.readFromSync(afterSeq, limit),
      (err, ev) =>
        this.log.error({ err, seq: ev.seq }, 'journal subscriber threw; it keeps receiving events'),
    );
    this.state = 'ready';
  }

  /** Opens (creating and migrating as needed) and starts the writer. */
  static async open(options: SqliteJournalOptions): Promise<SqliteJournal> {
    const init: WriterInit = {
      path: options.path,
      durability: options.durability ?? DEFAULT_DURABILITY,
      roomCacheSize: options.roomCacheSize ?? 50_000,
      create: options.create ?? true,
      role: 'writer',
    };
    const log = options.logger ?? silentLogger;
    if (!existsSync(options.path)) {
      if (!init.create) {
        throw new JournalError(
          'JOURNAL_NOT_FOUND',
          `no journal at ${options.path}; pass --journal PATH to name one`,
        );
      }
      mkdirSync(dirname(options.path), { recursive: true });
    }
    const lock = acquireWriterLock(options.path);
    let journal: SqliteJournal | null = null;
    let started: Awaited<ReturnType<typeof startWriter>>;
    try {
      started = await startWriter(init, { log, onRestarted: () => journal?.onWriterRestarted() });
    } catch (err) {
      lock.release();
      throw err;
    }
    try {
      journal = new SqliteJournal(options, started.writer, started.headSeq, log, lock);
    } catch (err) {
      started.writer.terminate();
      lock.release();
      throw err;
    }
    if (options.announce) {
      await journal.appendInternal({
        type: 'journal.opened',
        source: options.announce.source,
        data: {
          schemaVersion: journal.schemaVersionSync(),
          durability: init.durability,
          pid: process.pid,
          version: options.announce.version,
        },
      });
    }
    return journal;
  }

  private onWriterRestarted(): void {
    this.scheduleFlush();
  }

  /**
   * Fault injection for drills and tests: kills the writer thread the way a crash would (at
   * `power` durability; an inline writer has no thread and this does nothing). The supervisor
   * restarts it; appends queued meanwhile are committed once it is back.
   */
  crashWriterForDrill(): void {
    this.writer.crash();
  }

  /**
   * Fault injection for drills and tests: the database may grow to at most `pages` pages, so
   * commits that need more fail as on a full disk (SQLITE_FULL); null lifts the cap.
   */
  async limitPagesForDrill(pages: number | null): Promise<void> {
    await this.writer.run({ op: 'limit_pages', pages });
  }

  /** Pages the database has now: a `limitPagesForDrill` at this count makes the next growth fail. */
  pageCount(): number {
    return this.db.pragma('page_count', { simple: true }) as number;
  }

  private schemaVersionSync(): number {
    return this.db.prepare('SELECT max(version) FROM schema_migrations').pluck().get() as number;
  }

  append(input: EventInput): Promise<AppendResult> {
    return this.enqueue(input, false);
  }

  private appendInternal(input: Record<string, unknown>): Promise<AppendResult> {
    return this.enqueue(input, true);
  }

  private enqueue(input: unknown, internal: boolean): Promise<AppendResult> {
    if (this.state === 'closed' || this.state === 'draining') {
      return Promise.reject(
        new JournalError('JOURNAL_CLOSED', `journal ${this.path} is ${this.state}`),
      );
    }
    let ev: PendingEvent;
    try {
      ev = validateEvent(input, { internal });
    } catch (err) {
      return Promise.reject(err);
    }
    if (ev.type === 'room.created') {
      // Stored data is self-contained: replay never depends on this build's default deadlines.
      const d = ev.data as { deadlinesMs?: Parameters<typeof resolveDeadlines>[0] };
      ev.data = { ...ev.data, deadlinesMs: resolveDeadlines(d.deadlinesMs) };
    }
    return new Promise((resolve, reject) => {
      this.queue.push({ ev, resolve, reject });
      this.scheduleFlush();
    });
  }

  private scheduleFlush(): void {
    if (this.flushScheduled || this.inFlight >= this.maxInFlight) return;
    this.flushScheduled = true;
    setImmediate(() => {
      this.flushScheduled = false;
      this.flush();
    });
  }

  private flush(): void {
    // The whole queue is one transaction (up to maxBatch): appends of one turn commit together.
    // While the writer is restarting, onWriterRestarted flushes once it is up again.
    while (this.queue.length > 0 && this.inFlight < this.maxInFlight && this.writer.ready) {
      const size = Math.min(this.maxBatch, this.queue.length);
      const batch = size === this.queue.length ? this.queue : this.queue.slice(0, size);
      this.queue = size === this.queue.length ? [] : this.queue.slice(size);
      this.inFlight++;
      this.inFlightEvents += batch.length;
      this.writer.run({ op: 'append', events: batch.map((w) => w.ev) }).then(
        (reply) => this.settle(batch, reply.outcomes ?? []),
        (err) => this.fail(batch, err),
      );
    }
    this.notifyIdle();
  }

  private settle(batch: Waiting[], outcomes: Outcome[]): void {
    this.inFlight--;
    this.inFlightEvents -= batch.length;
    if (!this.writable) {
      this.log.warn(
        { failedForMs: Date.now() - this.failedSince, failedCommits: this.failuresUnlogged },
        'journal writable again',
      );
      this.failuresUnlogged = 0;
    }
    this.writable = true;
    this.lastError = null;
    this.commits++;
    this.lastBatchSize = batch.length;
    const results: AppendResult[] = new Array(batch.length);
    const publish = this.hub.size > 0 ? ([] as JournalEvent[]) : null;
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
    if (publish && publish.length > 0) this.hub.publish(publish);
    const resolve = (from: number, to: number) => {
      for (let i = from; i < to; i++) (batch[i] as Waiting).resolve(results[i] as AppendResult);
    };
    // Never flush straight from here: an inline writer settles in a microtask, and a direct
    // flush would chain commits without ever returning to the event loop.
    this.scheduleFlush();
    if (this.maxInFlight > 1 && batch.length >= 64) {
      // Acknowledge in two turns, the second after the next flush. Callers that append again
      // once acknowledged (engines do) then fill two transactions, and the writer thread
      // commits one while this thread prepares the other, instead of the two taking turns.
      const half = batch.length >> 1;
      resolve(0, half);
      setImmediate(() => resolve(half, batch.length));
    } else {
      resolve(0, batch.length);
    }
  }

  private fail(batch: Waiting[], err: unknown): void {
    this.inFlight--;
    this.inFlightEvents -= batch.length;
    const now = Date.now();
    if (this.writable) this.failedSince = now;
    const message = (err as Error).message;
    // The first failure, another error, then at most one line per 5 s while it lasts.
    if (message !== this.lastError || now - this.failureLoggedAt >= 5000) {
      this.log.error(
        { err, events: batch.length, failedCommitsNotLogged: this.failuresUnlogged },
        'journal commit failed; its appends are rejected',
      );
      this.failureLoggedAt = now;
      this.failuresUnlogged = 0;
    } else this.failuresUnlogged++;
    this.writable = false;
    this.lastError = message;
    for (const w of batch) w.reject(err);
    this.scheduleFlush();
  }

  private notifyIdle(): void {
    if (this.inFlight > 0 || this.queue.length > 0) return;
    for (const w of this.idleWaiters.splice(0)) w();
  }

  subscribe(afterSeq: number, listener: EventListener): Subscription {
    if (!Number.isSafeInteger(afterSeq) || afterSeq < 0) {
      throw new JournalError(
        'JOURNAL_BAD_QUERY',
        `afterSeq must be a non-negative integer, got ${afterSeq}`,
      );
    }
    return this.hub.subscribe(afterSeq, listener);
  }

  getCursor(name: string): Promise<number | null> {
    return this.read(
      () =>
        (this.db.prepare('SELECT seq FROM consumers WHERE name = ?').pluck().get(name) as
          | number
          | undefined) ?? null,
    );
  }

  async setCursor(name: string, seq: number): Promise<void> {
    if (typeof name !== 'string' || name.length === 0 || name.length > 200) {
      throw new JournalError(
        'JOURNAL_BAD_QUERY',
        'cursor name must be a non-empty string of at most 200 characters',
      );
    }
    if (!Number.isSafeInteger(seq) || seq < 0) {
      throw new JournalError(
        'JOURNAL_BAD_QUERY',
        `cursor seq must be a non-negative integer, got ${seq}`,
      );
    }
    await this.writer.run({ op: 'cursor', name, seq, ts: Date.now() });
  }

  async prune(opts: { cutoffTs: number; chunkRooms?: number }): Promise<PruneResult> {
    const chunkRooms = opts.chunkRooms ?? 500;
    if (!Number.isSafeInteger(opts.cutoffTs) || opts.cutoffTs < 0) {
      throw new JournalError('JOURNAL_BAD_QUERY', 'prune cut-off must be unix milliseconds');
    }
    if (!Number.isInteger(chunkRooms) || chunkRooms < 1 || chunkRooms > 100_000) {
      throw new JournalError('JOURNAL_BAD_QUERY', 'chunkRooms must be an integer from 1 to 100000');
    }
    const reply = await this.writer.run({ op: 'prune', cutoffTs: opts.cutoffTs, chunkRooms });
    const p = reply.prune ?? { rooms: 0, events: 0, batches: 0 };
    if (p.rooms > 0) {
      await this.appendInternal({
        type: 'journal.pruned',
        source: 'retention',
        data: { cutoffTs: opts.cutoffTs, rooms: p.rooms, events: p.events },
      });
    }
    return { cutoffTs: opts.cutoffTs, ...p };
  }

  health(): JournalHealth {
    return {
      state: this.state === 'ready' && !this.writer.ready ? 'starting' : this.state,
      writable: this.writable,
      lastError: this.lastError,
      pending: this.queue.length + this.inFlightEvents,
      committedSeq: this.committedSeq,
      commits: this.commits,
      lastBatchSize: this.lastBatchSize,
      writerRestarts: this.writer.restarts,
    };
  }

  /**
   * Finishes every append already accepted, then closes. New appends are refused meanwhile. If
   * the writer cannot finish within `timeoutMs` (default 10 s: a writer thread that keeps failing
   * to restart, say), what is left is rejected with JOURNAL_CLOSED and the journal closes anyway,
   * so a SIGTERM never hangs on it.
   */
  drain(options: { timeoutMs?: number } = {}): Promise<void> {
    if (this.drained) return this.drained;
    this.state = 'draining';
    const timeoutMs = options.timeoutMs ?? 10_000;
    this.drained = (async () => {
      if (this.inFlight > 0 || this.queue.length > 0) {
        let timer: NodeJS.Timeout | undefined;
        const idle = await Promise.race([
          new Promise<true>((resolve) => {
            this.idleWaiters.push(() => resolve(true));
            this.scheduleFlush();
          }),
          new Promise<false>((resolve) => {
            timer = setTimeout(() => resolve(false), timeoutMs);
          }),
        ]);
        clearTimeout(timer);
        if (!idle) {
          this.log.error(
            { pending: this.queue.length + this.inFlightEvents, timeoutMs },
            'journal drain timed out; closing with appends uncommitted',
          );
          this.close();
          return;
        }
      }
      // The reader goes first, so the writer's connection is the last one: SQLite then
      // checkpoints the WAL into the main file and removes it, and journal.db alone is whole.
      this.hub.closeAll();
      super.close();
      await this.writer.close();
      this.finish();
    })();
    return this.drained;
  }

  /** Stops at once: queued appends are rejected, the writer thread is terminated. */
  override close(): void {
    if (this.state === 'closed') return;
    this.state = 'closed';
    const err = new JournalError('JOURNAL_CLOSED', `journal ${this.path} was closed`);
    for (const w of this.queue.splice(0)) w.reject(err);
    this.writer.terminate();
    this.finish();
  }

  private finish(): void {
    this.state = 'closed';
    this.lock.release();
    this.hub.closeAll();
    super.close();
    for (const w of this.idleWaiters.splice(0)) w();
  }
}
