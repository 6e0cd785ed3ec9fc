/**
 * The PostgreSQL journal store: the same group commit as SQLite (src/journal/commit-queue.ts), on
 * one writing session that leads the journal (leadership.ts), with reads on a pool (reader.ts).
 * A lost writing session is reopened and leads on under its term unless another control plane
 * took over meanwhile; then this one is fenced: every append is refused with JOURNAL_FENCED, and
 * `onDeposed` listeners hear it once.
 */
import { hostname } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import type pg from 'pg';
import type { Logger } from '../../log.ts';
import { silentLogger } from '../../log.ts';
import { systemClock, type Timer } from '../../ports/clock.ts';
import type { EventInput } from '../../room/events.ts';
import { checkAfterSeq, checkCursor, checkPrune } from '../checks.ts';
import { CommitQueue } from '../commit-queue.ts';
import { JournalError } from '../errors.ts';
import { PACK_EVERY_MS, type PackTotals, packEvery } from '../packs.ts';
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
import { PgBatchWriter } from './batch.ts';
import { checkPostgresUrl, classifyPgError, connectClient, redactUrl } from './connect.ts';
import {
  type LeaderRow,
  readLeader,
  renewLease,
  resign,
  resumeLead,
  type TakeoverHow,
  tryLead,
} from './leadership.ts';
import { pgMigrate, pgSchemaVersion } from './migrate.ts';
import { PgPacker } from './packs/packer.ts';
import { HEAD_SEQ_SQL, OLDEST_WITH_ROWS } from './packs/sql.ts';
import { PgReader } from './reader.ts';

export interface PgJournalOptions {
  /** postgres://user:password@host:port/database */
  url: string;
  /** `power` (default): synchronous_commit on; `process`: off (docs/journal.md, "Durability"). */
  durability?: Durability;
  /** Most events in one transaction. Default 1024. */
  maxBatch?: number;
  /** Rooms kept in the writer's memory. Default 50 000. */
  roomCacheSize?: number;
  /** Who this control plane is, for standbys and `leader_terms`. Default host:pid. */
  holder?: string;
  /** How long a lease lasts without renewal. Default 2000 ms; renewed every third of it. */
  leaseMs?: number;
  /** Append `journal.opened` with this source once open. */
  announce?: { source: string; version: string };
  /**
   * Pack the events of rooms that ended this long ago, a row per room (packs.ts), every
   * PACK_EVERY_MS while this control plane leads. Default: never (`pack()` still packs).
   */
  packAfterMs?: number;
  /** How often packing looks for rooms to pack. Default PACK_EVERY_MS (tests: shorter). */
  packEveryMs?: number;
  logger?: Logger;
}

export interface Leadership {
  term: number;
  holder: string;
  how: TakeoverHow;
  previous: string | null;
}

const DEFAULT_LEASE_MS = 2000;

/**
 * Rooms packed in one transaction. More than SQLite's 16: each transaction pays round trips to the
 * server, 0.35 ms a room at 16 and 0.21 at 64 (a served journal, packing alone), about 13 ms of
 * the writing session a transaction.
 */
export const PG_PACK_ROOMS_PER_PASS = 64;

/**
 * A run of the packer that moved this many events out of `event_rows` vacuums it and `room_packs`
 * itself (`VACUUM (ANALYZE)`): the first packing of a large journal leaves millions of dead rows,
 * and until autovacuum passes, reads through the indexes walk their entries (every start 1.3–1.6 s
 * slower at 9.9 M events, 17–24 s at worst: docs/benchmarks.md). Packing as it runs while serving
 * moves far fewer a run, which autovacuum keeps up with.
 */
export const PG_VACUUM_AFTER_EVENTS = 100_000;

/** The error of an attempt to lead while another control plane does. */
function busy(where: string, current: LeaderRow): JournalError {
  const left = Math.max(0, current.leaseUntil - current.now);
  return new JournalError(
    'JOURNAL_BUSY',
    `journal ${where} is led by ${current.holder ?? 'another control plane'} (term ${current.term}, lease ${left} ms left); run this one as its standby, or stop that one first`,
  );
}

export class PgJournal extends PgReader implements JournalStore {
  private writer: pg.Client;
  private readonly batches: PgBatchWriter;
  private readonly queue: CommitQueue;
  private readonly hub: SubscriptionHub;
  private readonly log: Logger;
  private readonly leaseMs: number;
  private readonly durability: Durability;
  /** Work on the writing session runs one piece at a time: a transaction is never interleaved. */
  private chain: Promise<unknown> = Promise.resolve();
  private writerUp = true;
  private reconnecting = false;
  private reconnects = 0;
  private deposedBy: string | null = null;
  private readonly deposedListeners: Array<(why: string) => void> = [];
  private renewTimer: NodeJS.Timeout | null = null;
  private drained: Promise<void> | null = null;
  private readonly packer = new PgPacker();
  private packTimer: Timer | null = null;
  private packing: Promise<PackTotals> | null = null;
  /** The session a VACUUM after packing runs on; ended by `close` rather than waited for. */
  private vacuuming: pg.Client | null = null;

  private constructor(
    options: PgJournalOptions,
    writer: pg.Client,
    headSeq: number,
    readonly leadership: Leadership,
  ) {
    super(options.url, { applicationName: 'pdctl reader' });
    this.writer = writer;
    this.log = options.logger ?? silentLogger;
    this.leaseMs = options.leaseMs ?? DEFAULT_LEASE_MS;
    this.durability = options.durability ?? 'power';
    this.batches = new PgBatchWriter(headSeq, leadership.term, options.roomCacheSize ?? 50_000);
    this.hub = new SubscriptionHub(
      (afterSeq, limit) => this.readFrom(afterSeq, limit),
      (err, ev) =>
        this.log.error({ err, seq: ev.seq }, 'journal subscriber threw; it keeps receiving events'),
    );
    const self = this;
    this.queue = new CommitQueue(
      {
        committer: {
          get ready() {
            return self.writerUp || self.deposedBy !== null;
          },
          commit: (events) => this.onWriter((c) => this.batches.append(c, events)),
        },
        maxBatch: options.maxBatch ?? 1024,
        maxInFlight: 1,
        hub: this.hub,
        log: this.log,
        where: this.path,
      },
      headSeq,
    );
    this.watch(writer);
    this.renewTimer = setInterval(() => void this.renew(), Math.max(50, this.leaseMs / 3));
    this.renewTimer.unref();
    if (options.packAfterMs !== undefined) {
      this.packTimer = packEvery({
        afterMs: options.packAfterMs,
        everyMs: options.packEveryMs ?? PACK_EVERY_MS,
        ready: () => this.packing === null && this.writable(),
        pack: (cutoffTs, quick) => this.pack(cutoffTs, { pace: true, quick }),
        log: this.log,
      });
    }
  }

  private writable(): boolean {
    return this.queue.state === 'ready' && this.writerUp && this.deposedBy === null;
  }

  /**
   * Packs every room that ended before `cutoffTs`, PG_PACK_ROOMS_PER_PASS rooms a transaction on the
   * writing session, appends taking their turns between (packs.ts); `pace`: it rests after each
   * pass as long as the pass took; `quick`: the walk goes on from where the last run left off
   * rather than from the oldest room with rows; `signal` stops it between passes. A run that moved
   * `vacuumAfterEvents` events (PG_VACUUM_AFTER_EVENTS) or more vacuums the tables it emptied. One
   * run at a time: a second call waits for it.
   */
  async pack(
    cutoffTs: number,
    opts: {
      pace?: boolean;
      quick?: boolean;
      roomsPerPass?: number;
      signal?: AbortSignal;
      vacuumAfterEvents?: number;
    } = {},
  ): Promise<PackTotals> {
    while (this.packing) await this.packing.catch(() => {});
    this.packing = (async () => {
      const totals: PackTotals = { rooms: 0, events: 0, skipped: 0 };
      const whole = !opts.quick || this.packer.lost;
      const oldest = whole
        ? ((await this.query<{ oldest: number | null }>(OLDEST_WITH_ROWS))[0]?.oldest ?? null)
        : undefined;
      await this.packer.start(this.run, cutoffTs, oldest);
      const perPass = opts.roomsPerPass ?? PG_PACK_ROOMS_PER_PASS;
      while (this.writable() && !opts.signal?.aborted) {
        const started = performance.now();
        const next = await this.packer.next(this.run, cutoffTs, perPass);
        if (next.rooms.length > 0) {
          const pass = await this.onWriter((c) =>
            this.batches.packRooms(c, this.packer, next.rooms),
          );
          totals.rooms += pass.rooms;
          totals.events += pass.events;
          totals.skipped += pass.skipped;
        }
        if (next.done) break;
        if (opts.pace) await sleep(performance.now() - started);
      }
      const vacuumAfter = opts.vacuumAfterEvents ?? PG_VACUUM_AFTER_EVENTS;
      if (totals.events >= vacuumAfter && this.writable() && !opts.signal?.aborted)
        await this.vacuum(totals);
      return totals;
    })();
    try {
      return await this.packing;
    } finally {
      this.packing = null;
    }
  }

  /**
   * `VACUUM (ANALYZE)` of the tables a large packing run emptied and filled, on a session of its
   * own (VACUUM runs outside a transaction; plain VACUUM does not block appends). A failure is
   * logged, never thrown: autovacuum does it later.
   */
  private async vacuum(totals: PackTotals): Promise<void> {
    const started = performance.now();
    try {
      this.vacuuming = await connectClient({ url: this.url, applicationName: 'pdctl vacuum' });
      // Closed while it connected: the process is stopping, and would wait for the VACUUM.
      if (this.queue.state === 'closed') return;
      await this.vacuuming.query('VACUUM (ANALYZE) event_rows, room_packs');
      this.log.info(
        {
          packedRooms: totals.rooms,
          packedEvents: totals.events,
          ms: Math.round(performance.now() - started),
        },
        'vacuumed event_rows and room_packs after packing',
      );
    } catch (err) {
      if (this.queue.state !== 'closed')
        this.log.warn(
          { err, packedEvents: totals.events },
          'could not VACUUM event_rows after packing; autovacuum will (run VACUUM (ANALYZE) event_rows by hand if starts are slow)',
        );
    } finally {
      void this.vacuuming?.end().catch(() => {});
      this.vacuuming = null;
    }
  }

  /**
   * Opens the journal (creating and migrating its tables as needed) and takes the lead. Refuses
   * with JOURNAL_BUSY when another control plane leads it; `waitForLead` (a standby) waits for
   * that one to go instead, calling `onWaiting` once.
   */
  static async open(
    options: PgJournalOptions & {
      waitForLead?: {
        signal?: AbortSignal;
        onWaiting?: (current: LeaderRow) => void;
        /** The database could not be reached while waiting; the wait goes on. */
        onUnreachable?: (err: JournalError) => void;
      };
    },
  ): Promise<PgJournal> {
    checkPostgresUrl(options.url);
    const where = redactUrl(options.url);
    const holder = options.holder ?? `${hostname()}:${process.pid}`;
    const leaseMs = options.leaseMs ?? DEFAULT_LEASE_MS;
    const connect = async () => {
      const c = await connectClient({ url: options.url, applicationName: 'pdctl writer' });
      try {
        await setSession(c, options.durability ?? 'power');
      } catch (err) {
        await c.end().catch(() => {});
        throw err;
      }
      return c;
    };
    let writer = await connect();
    try {
      await pgMigrate(writer, where);
      let attempt = await tryLead(writer, holder, leaseMs);
      let told = false;
      while (!attempt.ok) {
        const wait = options.waitForLead;
        if (!wait) throw busy(where, attempt.current);
        if (!told) {
          told = true;
          wait.onWaiting?.(attempt.current);
        }
        if (wait.signal?.aborted)
          throw new JournalError('JOURNAL_CLOSED', 'stopped waiting to lead');
        await new Promise((r) => setTimeout(r, Math.min(250, leaseMs / 4)));
        try {
          attempt = await tryLead(writer, holder, leaseMs);
        } catch (err) {
          // The database went away while this one stood by: wait for it, and stand by again.
          const e = classifyPgError(err, options.url);
          if (e.code !== 'JOURNAL_UNREACHABLE') throw e;
          wait.onUnreachable?.(e);
          await writer.end().catch(() => {});
          writer = await reconnectWhileWaiting(connect, wait.signal);
        }
      }
      const head = await writer.query<{ head: number }>(HEAD_SEQ_SQL);
      const journal = new PgJournal(options, writer, head.rows[0]?.head ?? 0, {
        term: attempt.term,
        holder,
        how: attempt.how,
        previous: attempt.previous,
      });
      if (options.announce) {
        const announced = journal.queue.enqueue(
          {
            type: 'journal.opened',
            source: options.announce.source,
            data: {
              schemaVersion: (await pgSchemaVersion(writer)) ?? 0,
              durability: options.durability ?? 'power',
              pid: process.pid,
              version: options.announce.version,
              backend: 'postgres',
              term: attempt.term,
              holder,
              how: attempt.how,
              ...(attempt.previous !== null ? { previous: attempt.previous } : {}),
            },
          },
          false,
        );
        await announced.catch((err: unknown) => {
          journal.close();
          throw err;
        });
      }
      return journal;
    } catch (err) {
      await writer.end().catch(() => {});
      throw classifyPgError(err, options.url);
    }
  }

  /** Runs `fn` on the writing session when the work before it is done. */
  private onWriter<T>(fn: (c: pg.Client) => Promise<T>): Promise<T> {
    const run = this.chain.then(async () => {
      if (this.deposedBy !== null) throw this.fencedError();
      if (!this.writerUp) {
        throw new JournalError(
          'JOURNAL_UNREACHABLE',
          `lost the journal at ${this.path}; reconnecting`,
        );
      }
      try {
        return await fn(this.writer);
      } catch (err) {
        const e = classifyPgError(err, this.url);
        if (e.code === 'JOURNAL_FENCED') this.depose('a newer term took the journal');
        else if (e.code === 'JOURNAL_UNREACHABLE') this.lostWriter(e);
        throw e;
      }
    });
    this.chain = run.catch(() => {});
    return run;
  }

  private fencedError(): JournalError {
    return new JournalError(
      'JOURNAL_FENCED',
      `this control plane no longer leads ${this.path} (term ${this.leadership.term}: ${this.deposedBy}); its appends are refused`,
    );
  }

  private watch(writer: pg.Client): void {
    writer.on('error', (err) => {
      if (writer === this.writer) this.lostWriter(classifyPgError(err, this.url));
    });
  }

  private depose(why: string): void {
    if (this.deposedBy !== null) return;
    this.deposedBy = why;
    this.log.error(
      { term: this.leadership.term, holder: this.leadership.holder, why },
      'this control plane no longer leads the journal; appends are refused',
    );
    this.queue.kick();
    for (const l of this.deposedListeners) l(why);
  }

  /** Called once, when another control plane has taken the journal from this one. */
  onDeposed(listener: (why: string) => void): void {
    this.deposedListeners.push(listener);
    if (this.deposedBy !== null) listener(this.deposedBy);
  }

  /** The writing session is gone: open another and lead on under the same term, if still ours. */
  private lostWriter(err: JournalError): void {
    if (!this.writerUp || this.queue.state === 'closed') return;
    this.writerUp = false;
    this.log.warn({ err: err.message }, 'lost the journal writing session; reconnecting');
    void this.writer.end().catch(() => {});
    if (!this.reconnecting) void this.reconnect();
  }

  private async reconnect(): Promise<void> {
    this.reconnecting = true;
    let delay = 100;
    try {
      while (this.queue.state !== 'closed' && this.deposedBy === null) {
        try {
          const c = await connectClient({ url: this.url, applicationName: 'pdctl writer' });
          try {
            await setSession(c, this.durability);
            if (!(await resumeLead(c, this.leadership.term, this.leaseMs))) {
              await c.end().catch(() => {});
              const now = await this.leaderNow().catch(() => null);
              this.depose(
                `while its session was lost, ${now?.holder ?? 'another control plane'} took term ${now?.term ?? '?'}`,
              );
              return;
            }
            const head = await c.query<{ head: number }>(HEAD_SEQ_SQL);
            // The last commit before the loss may or may not have landed: relearn, not assume.
            this.batches.forget(head.rows[0]?.head ?? 0);
          } catch (err) {
            await c.end().catch(() => {});
            throw err;
          }
          this.writer = c;
          this.watch(c);
          this.writerUp = true;
          this.reconnects++;
          this.log.warn({ term: this.leadership.term }, 'journal writing session back; leading on');
          this.queue.kick();
          return;
        } catch (err) {
          this.log.debug({ err: (err as Error).message, delay }, 'journal reconnect failed');
          await new Promise((r) => setTimeout(r, delay));
          delay = Math.min(1000, delay * 2);
        }
      }
    } finally {
      this.reconnecting = false;
    }
  }

  /**
   * Names this leader by where it can be reached, once it knows (its HTTP and bus addresses are
   * bound after it leads): what standbys print and `leader_terms` keeps.
   */
  async setHolder(holder: string): Promise<void> {
    const term = this.leadership.term;
    await this.onWriter(async (c) => {
      await c.query('UPDATE leadership SET holder = $1 WHERE id = 1 AND term = $2', [holder, term]);
      await c.query('UPDATE leader_terms SET holder = $1 WHERE term = $2', [holder, term]);
    });
    this.leadership.holder = holder;
  }

  /** The leadership row as it is now (for messages, status and standbys). */
  async leaderNow(): Promise<LeaderRow> {
    const c = await this.pool.connect();
    try {
      return await readLeader(c);
    } finally {
      c.release();
    }
  }

  private async renew(): Promise<void> {
    if (!this.writerUp || this.deposedBy !== null || this.queue.state === 'closed') return;
    try {
      const ok = await this.onWriter((c) => renewLease(c, this.leadership.term, this.leaseMs));
      if (!ok) this.depose('the lease was renewed by nobody and another control plane took it');
    } catch {
      // Logged by the reconnect (a lost session) or by depose (fenced).
    }
  }

  append(input: EventInput): Promise<AppendResult> {
    return this.queue.enqueue(input, false);
  }

  subscribe(afterSeq: number, listener: EventListener): Subscription {
    checkAfterSeq(afterSeq);
    return this.hub.subscribe(afterSeq, listener);
  }

  async getCursor(name: string): Promise<number | null> {
    const [r] = await this.query<{ seq: number }>({
      sql: 'SELECT seq FROM consumers WHERE name = ?',
      params: [name],
    });
    return r?.seq ?? null;
  }

  async setCheckpoint(checkpoint: CheckpointInput): Promise<void> {
    await this.onWriter((c) => this.batches.setCheckpoint(c, checkpoint, Date.now()));
  }

  async setCursor(name: string, seq: number): Promise<void> {
    checkCursor(name, seq);
    await this.onWriter((c) => this.batches.setCursor(c, name, seq, Date.now()));
  }

  async prune(opts: PruneOptions): Promise<PruneResult> {
    const chunkRooms = checkPrune(opts);
    // One chunk per turn on the writing session, so appends interleave with a long prune.
    return pruneInChunks(
      { ...opts, chunkRooms },
      {
        rooms: (cutoffTs, limit) =>
          this.onWriter((c) => this.batches.pruneChunk(c, cutoffTs, limit)),
        others: (cutoffTs, limit) =>
          this.onWriter((c) => this.batches.pruneOthers(c, cutoffTs, limit)),
        archiving: {
          pickRooms: (cutoffTs, limit) => this.pruneCandidates(cutoffTs, limit),
          deleteRooms: (rooms, upToSeq) =>
            this.onWriter((c) => this.batches.pruneNamedRooms(c, rooms, upToSeq)),
          pickOthers: (cutoffTs, limit) => this.otherCandidates(cutoffTs, limit),
          deleteEvents: (seqs) => this.onWriter((c) => this.batches.pruneSeqs(c, seqs)),
        },
      },
      (r) => this.queue.recordPruned(r),
    );
  }

  health(): JournalHealth {
    const state = this.queue.state;
    return {
      state:
        this.deposedBy !== null
          ? 'failed'
          : state === 'ready' && !this.writerUp
            ? 'starting'
            : state,
      ...this.queue.health(),
      ...(this.deposedBy !== null
        ? { writable: false, lastError: this.fencedError().message }
        : {}),
      writerRestarts: this.reconnects,
      term: this.leadership.term,
    };
  }

  /**
   * Finishes every append already accepted, then hands the lead over (the lease ends now, so a
   * standby takes over at once) and closes. Never hangs past `timeoutMs` (default 10 s).
   */
  drain(options: { timeoutMs?: number } = {}): Promise<void> {
    if (this.drained) return this.drained;
    this.drained = (async () => {
      const idle = await this.queue.drain(options.timeoutMs ?? 10_000);
      if (idle && this.writerUp && this.deposedBy === null) {
        await this.onWriter((c) => resign(c, this.leadership.term)).catch((err: unknown) =>
          this.log.warn({ err }, 'could not hand the journal over; a standby waits out the lease'),
        );
      }
      this.close();
      await this.chain;
    })();
    return this.drained;
  }

  /** Stops at once: queued appends are rejected; the session ends (a standby takes over). */
  override close(): void {
    if (this.renewTimer) clearInterval(this.renewTimer);
    this.renewTimer = null;
    systemClock.clear(this.packTimer);
    this.packTimer = null;
    this.queue.close();
    this.hub.closeAll();
    void this.writer.end().catch(() => {});
    void this.vacuuming?.end().catch(() => {});
    super.close();
  }
}

/** Connects again, backing off up to 1 s, until it works or the wait is stopped. */
async function reconnectWhileWaiting(
  connect: () => Promise<pg.Client>,
  signal: AbortSignal | undefined,
): Promise<pg.Client> {
  let delay = 100;
  for (;;) {
    if (signal?.aborted) throw new JournalError('JOURNAL_CLOSED', 'stopped waiting to lead');
    try {
      return await connect();
    } catch {
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(1000, delay * 2);
    }
  }
}

async function setSession(c: pg.ClientBase, durability: Durability): Promise<void> {
  // `process`: a commit is acknowledged before PostgreSQL flushes its WAL, so a crash of the
  // database server may lose the last few hundred ms; a crash of pdctl loses nothing.
  await c.query(`SET synchronous_commit = ${durability === 'power' ? 'on' : 'off'}`);
  // A leader frozen inside a transaction must not hold the leadership row for ever.
  await c.query("SET idle_in_transaction_session_timeout = '10s'");
}
