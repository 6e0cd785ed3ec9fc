/**
 * The SQLite journal store: group commit on the main thread, commits by a writer (writers.ts),
 * reads on a read-only connection. Appends that arrive in one event-loop turn share one
 * transaction; while a transaction is committing, new appends gather into the next one.
 */
import { existsSync, statSync } from 'node:fs';
import type { Worker } from 'node:worker_threads';
import type { Logger } from '../../log.ts';
import { silentLogger } from '../../log.ts';
import { type Clock, systemClock, type Timer } from '../../ports/clock.ts';
import type { Ids } from '../../ports/ids.ts';
import type { EventInput } from '../../room/events.ts';
import { checkAfterSeq, checkCursor, checkPrune } from '../checks.ts';
import { CommitQueue } from '../commit-queue.ts';
import { JournalError } from '../errors.ts';
import { PACK_EVERY_MS, PACK_ROOMS_PER_PASS, type PackTotals, packEvery } from '../packs.ts';
import { pruneInChunks } from '../prune.ts';
import type {
  AppendResult,
  CheckpointInput,
  Durability,
  EventListener,
  JournalHealth,
  JournalStore,
  PruneOptions,
  PruneResult,
  Subscription,
} from '../store.ts';
import { SubscriptionHub } from '../subscriptions.ts';
import type { SqliteFaults } from './faults.ts';
import { DEFAULT_DURABILITY } from './open.ts';
import type { PackPass } from './packs/packer.ts';
import { makeJournalDir, sharedJournal } from './privacy.ts';
import { SqliteReader } from './reader.ts';
import type { ScanResult } from './scan-thread.ts';
import { acquireWriterLock, type WriterLock } from './writer-lock.ts';
import type { WriterInit, WriterOp } from './writer-protocol.ts';
import { spawnThread, startWriter, type Writer } from './writers.ts';

/**
 * Above this size a serving control plane scans its journal after it starts rather than before:
 * `quick_check` reads every page, about 1.1 s a GB here (docs/journal.md, "Durability").
 */
export const SCAN_LATER_ABOVE_BYTES = 64 * 1024 * 1024;

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
  /**
   * A file bigger than this many bytes is scanned (`quick_check`) after it opens, in a thread of
   * its own, instead of before: a start then does not wait for a read of every page. Default:
   * always before (`pdctl serve` passes SCAN_LATER_ABOVE_BYTES).
   */
  scanLaterAbove?: number;
  /**
   * With `scanLaterAbove`: how long after it opens the scan waits, unless `scanNow()` starts it
   * sooner (a serving stack, once ready: on two cores the scan slows the engines' start). Default
   * 0: at once.
   */
  scanAfterMs?: number;
  /**
   * Pack the events of rooms that ended this long ago, a row per room (packs/packer.ts), every
   * PACK_EVERY_MS while open (a serving control plane: PACK_AFTER_MS). Default: never (tools that
   * open a journal for a moment; `pack()` still packs when called).
   */
  packAfterMs?: number;
  /** How often packing looks for rooms to pack. Default PACK_EVERY_MS (tests: shorter). */
  packEveryMs?: number;
  logger?: Logger;
  /**
   * Stamps events, checkpoints and cursors, and times packing. Default: the process's clock (the
   * simulator runs the journal on its virtual one).
   */
  clock?: Clock;
  /** Names events appended without an id. Default: the process's ids. */
  ids?: Ids;
  /** Process durability: who checkpoints the WAL (writer-protocol.ts). Default `thread`. */
  walCheckpoints?: 'thread' | 'inline';
  /** Drills, tests and the simulator: give the journal its fault hooks (`faults`). Default false. */
  faults?: boolean;
}

export class SqliteJournal extends SqliteReader implements JournalStore {
  private readonly writer: Writer;
  /** A full disk and a crashed writer on demand; null unless opened with `faults: true`. */
  readonly faults: SqliteFaults | null;
  private readonly log: Logger;
  private readonly hub: SubscriptionHub;
  private readonly queue: CommitQueue;
  private drained: Promise<void> | null = null;
  /** The after-start scan while it waits for its time (`scanAfter`). */
  private scanTimer: NodeJS.Timeout | null = null;
  /** The after-start `quick_check` while it runs, and what it found wrong. */
  private scanning: Worker | null = null;
  private damaged: JournalError | null = null;
  private packTimer: Timer | null = null;
  private readonly clock: Clock;
  private packing: Promise<PackTotals> | null = null;

  private constructor(
    options: SqliteJournalOptions,
    writer: Writer,
    headSeq: number,
    log: Logger,
    private readonly lock: WriterLock,
  ) {
    super(options.path);
    this.clock = options.clock ?? systemClock;
    this.writer = writer;
    this.faults = options.faults
      ? {
          crashWriter: () => writer.crash(),
          limitPages: async (pages) => {
            await this.write({ op: 'limit_pages', pages });
          },
          pageCount: () => this.db.pragma('page_count', { simple: true }) as number,
        }
      : null;
    this.log = log;
    this.hub = new SubscriptionHub(
      (afterSeq, limit) => this.readFromSync(afterSeq, limit),
      (err, ev) =>
        this.log.error({ err, seq: ev.seq }, 'journal subscriber threw; it keeps receiving events'),
      this.clock,
    );
    this.queue = new CommitQueue(
      {
        committer: {
          get ready() {
            return writer.ready;
          },
          commit: async (events, fence) =>
            (await this.write({ op: 'append', events, fence })).outcomes ?? [],
        },
        // An inline writer blocks the event loop for the length of a batch: keep batches shorter
        // there; a writer thread commits one batch while the next is prepared (pipelining).
        maxBatch: options.maxBatch ?? (writer.kind === 'inline' ? 256 : 4096),
        maxInFlight: writer.kind === 'inline' ? 1 : 2,
        hub: this.hub,
        log,
        where: options.path,
        clock: this.clock,
        ...(options.ids ? { ids: options.ids } : {}),
      },
      headSeq,
    );
  }

  /** Opens (creating and migrating as needed) and starts the writer. */
  static async open(options: SqliteJournalOptions): Promise<SqliteJournal> {
    const init: WriterInit = {
      path: options.path,
      durability: options.durability ?? DEFAULT_DURABILITY,
      roomCacheSize: options.roomCacheSize ?? 50_000,
      create: options.create ?? true,
      role: 'writer',
      ...(options.walCheckpoints ? { walCheckpoints: options.walCheckpoints } : {}),
    };
    const log = options.logger ?? silentLogger;
    const scanLater =
      options.scanLaterAbove !== undefined &&
      existsSync(options.path) &&
      statSync(options.path).size > options.scanLaterAbove;
    if (scanLater) init.scan = false;
    if (!existsSync(options.path)) {
      if (!init.create) {
        throw new JournalError(
          'JOURNAL_NOT_FOUND',
          `no journal at ${options.path}; pass --journal PATH to name one`,
        );
      }
      makeJournalDir(options.path);
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
    const shared = sharedJournal(options.path);
    if (shared)
      log.warn(
        { journal: options.path, readableByOthers: shared.shared, fix: shared.fix },
        `the journal is readable by other users of this machine (it holds request ids, trace context and timings); pdctl left it as it is — to fix: ${shared.fix}`,
      );
    try {
      journal = new SqliteJournal(options, started.writer, started.headSeq, log, lock);
    } catch (err) {
      started.writer.terminate();
      lock.release();
      throw err;
    }
    if (options.announce) {
      try {
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
      } catch (err) {
        // A journal that takes no write at all (an immutable file SQLite opened read-only, a
        // full disk) is an open error: its threads end and its lock goes, so serve exits.
        journal.close();
        throw err;
      }
    }
    if (scanLater) journal.scanAfter(options.scanAfterMs ?? 0);
    if (options.packAfterMs !== undefined) {
      journal.packTimer = packEvery({
        clock: journal.clock,
        afterMs: options.packAfterMs,
        everyMs: options.packEveryMs ?? PACK_EVERY_MS,
        ready: () => journal.packing === null && journal.queue.state === 'ready',
        pack: (cutoffTs, quick) => journal.pack(cutoffTs, { pace: true, quick }),
        log: journal.log,
      });
    }
    return journal;
  }

  /**
   * Packs every room that ended before `cutoffTs` (a pass of a few dozen rooms at a time; appends
   * take their turn on the writer between passes; with `pace`, it rests after each pass as long as
   * the pass took, as retention does; `signal` stops it between passes; `roomsPerPass`: default
   * PACK_ROOMS_PER_PASS; `quick`: stop at the first room created after `cutoffTs`, which misses
   * rooms out of the order of their first events — packs/packer.ts). One run at a time: a second
   * call waits for it.
   */
  async pack(
    cutoffTs: number,
    opts: { pace?: boolean; signal?: AbortSignal; roomsPerPass?: number; quick?: boolean } = {},
  ): Promise<PackTotals> {
    while (this.packing) await this.packing;
    this.packing = (async () => {
      const totals: PackTotals = { rooms: 0, events: 0, skipped: 0 };
      let afterKey = 0;
      // Closing or closed: what is left waits for the next start.
      while (this.queue.state === 'ready' && !opts.signal?.aborted) {
        const started = this.clock.monotonic();
        const pass = (
          await this.write({
            op: 'pack_rooms',
            cutoffTs,
            limit: opts.roomsPerPass ?? PACK_ROOMS_PER_PASS,
            afterKey,
            whole: !opts.quick,
          })
        ).packed as PackPass;
        afterKey = pass.lastKey;
        const took = this.clock.monotonic() - started;
        if (opts.pace && took > 0) await new Promise<void>((r) => this.clock.setTimeout(r, took));
        totals.rooms += pass.rooms;
        totals.events += pass.events;
        totals.skipped += pass.skipped;
        if (pass.done) break;
      }
      return totals;
    })();
    try {
      return await this.packing;
    } finally {
      this.packing = null;
    }
  }

  /** The after-start scan, in `ms` or when `scanNow()` is called, whichever comes first. */
  private scanAfter(ms: number): void {
    if (ms <= 0) {
      this.scanInBackground();
      return;
    }
    this.scanTimer = setTimeout(() => this.scanNow(), ms);
    this.scanTimer.unref();
  }

  /** Starts the after-start scan now if it is waiting; otherwise nothing. */
  scanNow(): void {
    if (this.scanTimer === null) return;
    clearTimeout(this.scanTimer);
    this.scanTimer = null;
    if (this.queue.state === 'ready') this.scanInBackground();
  }

  /**
   * SQLite's `quick_check` of the whole file, on a thread and connection of its own, while the
   * journal serves. A damaged file is written no more: every write is refused from then on with
   * JOURNAL_CORRUPT, which `/health/ready` and the outage answerer pass on.
   */
  private scanInBackground(): void {
    const worker = spawnThread('scan-thread', { path: this.path });
    // Never what keeps a process that is done alive.
    worker.unref();
    this.scanning = worker;
    const done = () => {
      if (this.scanning === worker) this.scanning = null;
    };
    worker.once('message', (r: ScanResult) => {
      done();
      if (r.problem === null) {
        this.log.info({ ms: Math.round(r.ms) }, 'journal quick_check passed (after start)');
        return;
      }
      this.damaged = new JournalError(
        'JOURNAL_CORRUPT',
        `${this.path} failed SQLite's quick_check after pdctl started on it (${r.problem}); every write to it is refused from now on, so that it is not damaged further. To get at what it holds: \`pdctl journal backup --journal ${this.path} --to COPY.db\` copies what SQLite can still read, \`sqlite3 ${this.path} .recover > recovered.sql\` salvages rows from damaged pages (on a copy). Then stop pdctl serve, move the journal aside (with its -wal and -shm) and start again`,
      );
      this.log.error({ problem: r.problem }, this.damaged.message);
    });
    worker.once('error', (err) => {
      done();
      this.log.warn({ err: err.message }, 'journal quick_check could not run after start');
    });
  }

  /** Every write goes through here: none once the scan found the file damaged. */
  private async write(op: WriterOp) {
    if (this.damaged) throw this.damaged;
    return this.writer.run(op);
  }

  private onWriterRestarted(): void {
    this.queue.kick();
  }

  private schemaVersionSync(): number {
    return this.db.prepare('SELECT max(version) FROM schema_migrations').pluck().get() as number;
  }

  append(input: EventInput): Promise<AppendResult> {
    return this.queue.enqueue(input, false);
  }

  private appendInternal(input: Record<string, unknown>): Promise<AppendResult> {
    return this.queue.enqueue(input, true);
  }

  subscribe(afterSeq: number, listener: EventListener): Subscription {
    checkAfterSeq(afterSeq);
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

  async setCheckpoint(checkpoint: CheckpointInput): Promise<void> {
    await this.write({ op: 'save_state', checkpoint, ts: this.clock.now() });
  }

  async setCursor(name: string, seq: number): Promise<void> {
    checkCursor(name, seq);
    await this.write({ op: 'cursor', name, seq, ts: this.clock.now() });
  }

  async prune(opts: PruneOptions): Promise<PruneResult> {
    const chunkRooms = checkPrune(opts);
    const pruned = async (op: WriterOp) => (await this.write(op)).pruned ?? none;
    const none = { rooms: 0, events: 0 };
    return pruneInChunks(
      { ...opts, chunkRooms },
      {
        rooms: (cutoffTs, limit) => pruned({ op: 'prune_rooms', cutoffTs, limit }),
        others: async (cutoffTs, limit) =>
          (await pruned({ op: 'prune_events', cutoffTs, limit })).events,
        archiving: {
          pickRooms: (cutoffTs, limit) => this.pruneCandidates(cutoffTs, limit),
          deleteRooms: (rooms, upToSeq) => pruned({ op: 'prune_named_rooms', rooms, upToSeq }),
          pickOthers: (cutoffTs, limit) => this.otherCandidates(cutoffTs, limit),
          deleteEvents: async (seqs) => (await pruned({ op: 'prune_seqs', seqs })).events,
        },
      },
      (r) => this.queue.recordPruned(r),
    );
  }

  health(): JournalHealth {
    const state = this.queue.state;
    return {
      state: state === 'ready' && !this.writer.ready ? 'starting' : state,
      ...this.queue.health(),
      ...(this.damaged ? { writable: false, lastError: this.damaged.message } : {}),
      writerRestarts: this.writer.restarts,
      term: null,
      synchronous: this.writer.synchronous,
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
    this.drained = (async () => {
      if (!(await this.queue.drain(options.timeoutMs ?? 10_000))) {
        this.close();
        return;
      }
      // The reader goes first, so the writer's connection is the last one: SQLite then
      // checkpoints the WAL into the main file and removes it, and journal.db alone is whole.
      this.hub.closeAll();
      super.close();
      // Not awaited: a thread inside quick_check ends only when the check returns (seconds on a
      // big file), and a SIGTERM must not wait for it. Its connection only reads.
      if (this.scanTimer) clearTimeout(this.scanTimer);
      this.scanTimer = null;
      void this.scanning?.terminate();
      await this.writer.close();
      this.finish();
    })();
    return this.drained;
  }

  /** Stops at once: queued appends are rejected, the writer thread is terminated. */
  override close(): void {
    if (this.queue.state === 'closed') return;
    this.queue.close();
    this.writer.terminate();
    this.finish();
  }

  private finish(): void {
    this.clock.clear(this.packTimer);
    this.packTimer = null;
    void this.scanning?.terminate();
    this.scanning = null;
    this.queue.close();
    this.lock.release();
    this.hub.closeAll();
    super.close();
  }
}
