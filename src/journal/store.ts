/**
 * The journal as its callers see it (docs/design.md §4, §11). Everything but `src/journal/`, the
 * composition root (`src/app/`) and the journal administration commands talks to this interface,
 * never to SQLite (`npm run arch` checks it), so that another backend can stand behind it.
 */
import type { EventInput, EventType, JournalEvent, JournalEventOf } from '../room/events.ts';
import type { RejectReason, Room } from '../room/reducer.ts';
import type { RoomState } from '../room/states.ts';

/**
 * `process`: a committed event survives any process crash
 * (kill -9 included); a power cut may lose the last transactions but never corrupts the file.
 * `power`: every commit reaches stable storage before it is acknowledged (SQLite: synchronous=FULL
 * in WAL mode; process is synchronous=NORMAL).
 */
export type Durability = 'process' | 'power';
export const DURABILITIES: readonly Durability[] = ['process', 'power'];

/** What `append` resolves to once its transaction has committed. */
export type AppendResult =
  | { status: 'applied'; seq: number; eventId: string; state: RoomState | null }
  | {
      status: 'rejected';
      /**
       * The seq of the `room.event_rejected` record; for `event_id_conflict` (nothing written),
       * the seq of the event that holds the id.
       */
      seq: number;
      eventId: string;
      reason: RejectReason;
      state: RoomState | null;
      detail: string;
    }
  | {
      /** The event_id was committed before; nothing new was written. */
      status: 'duplicate';
      seq: number;
      eventId: string;
      original: 'applied' | 'rejected';
    };

export interface RoomFilter {
  state?: RoomState | RoomState[];
  /** Either engine of the pair. */
  engine?: string;
  reason?: string;
  /** Rooms alive at some point in [since, until] (unix ms). */
  since?: number;
  until?: number;
  /** Rooms created at or before T and not terminal at T (unix ms). */
  inFlightAt?: number;
  /** Only rooms created by one of these (`room.created`'s source: `api`, `canary`, …). */
  origin?: string[];
  /** Only the rooms of this HTTP request (its `x-request-id`): one, or a chain of migrations. */
  requestId?: string;
  /** Only the rooms of this tenant's requests (`room.created.tenant`). */
  tenant?: string;
  /** No rooms created by any of these: `['canary']` keeps health canaries out of a listing. */
  excludeOrigin?: string[];
  /** Only rooms that one of their two engines has not released yet. */
  unreleased?: boolean;
  /** At most this many rooms (default 100, max 10 000). */
  limit?: number;
  /** Opaque cursor from the previous page. */
  cursor?: string;
}

/** Room listings leave these origins out unless asked: the background canary runs every few seconds. */
export const HIDDEN_ORIGINS: readonly string[] = ['canary'];

/**
 * The origin part of a room filter from what a user typed (`--origin`, `?origin=`): absent → every
 * origin but the hidden ones; `all` → every origin; `api,migration` → those only. Throws a message
 * that names the problem for anything else.
 */
export function originFilter(
  value: string | undefined,
): Pick<RoomFilter, 'origin' | 'excludeOrigin'> {
  if (value === undefined) return { excludeOrigin: [...HIDDEN_ORIGINS] };
  if (value === 'all') return {};
  const origins = value.split(',').map((o) => o.trim());
  const bad = origins.find((o) => !/^[A-Za-z0-9._:-]{1,64}$/.test(o));
  if (bad !== undefined) {
    throw new Error(
      `origin must be "all" or a comma-separated list of room origins (api, canary, migration, …), got "${bad}"`,
    );
  }
  return { origin: origins };
}

export interface RoomPage {
  rooms: Room[];
  nextCursor: string | null;
}

export interface StateSpan {
  state: RoomState;
  from: number;
  to: number | null;
  ms: number | null;
}

export interface Timeline {
  room: Room | null;
  events: JournalEvent[];
  /** Time spent in each state, in order; the current state has `to: null`. */
  spans: StateSpan[];
}

export interface TailFilter<T extends EventType = EventType> {
  /** Only events with seq greater than this. */
  afterSeq?: number;
  type?: T | T[];
  room?: string;
  engine?: string;
  /** Only events at or after this time (unix ms). */
  since?: number;
  /**
   * Only the refusals of this request: `request.refused` events whose `requestIds` (20 at most to
   * an event, api/refusals.ts) hold this `x-request-id`.
   */
  requestId?: string;
  limit?: number;
  /** The newest `limit` events (default) or the oldest after `afterSeq`. */
  order?: 'newest' | 'oldest';
}

export interface MinuteCount {
  /** Start of the minute (unix ms). */
  minute: number;
  /** State entered, or `failed`/`aborted` split by reason. */
  state: RoomState;
  reason: string | null;
  count: number;
}

export interface JournalStats {
  path: string;
  schemaVersion: number;
  events: number;
  firstSeq: number | null;
  lastSeq: number | null;
  firstTs: number | null;
  lastTs: number | null;
  rooms: number;
  /** SQLite schema 8: rooms whose events are packed (docs/journal.md, _Packed rooms_). */
  packedRooms?: number;
  byState: Partial<Record<RoomState, number>>;
  failuresByReason: Record<string, number>;
  abortsByReason: Record<string, number>;
  /** Requests refused before they had a room (`request.refused`), summed by reason. */
  refusalsByReason: Record<string, number>;
  rejectedEvents: number;
  eventsByType: Record<string, number>;
  consumers: Array<{ name: string; seq: number; updatedAt: number }>;
  fileBytes: number;
  /**
   * PostgreSQL: every leadership term, oldest first — who led, from when, how it came to (see
   * docs/journal.md, "One leader, fenced"), and how many events it wrote. Absent for SQLite.
   */
  leaders?: LeaderTerm[];
}

export interface LeaderTerm {
  term: number;
  holder: string;
  acquiredAt: number;
  how: string;
  previous: string | null;
  events: number;
}

export interface VerifyReport {
  ok: boolean;
  /** SQLite's integrity_check result (`ok`), or why none was run (PostgreSQL). */
  integrity: string;
  events: number;
  rooms: number;
  /** Rooms whose projection row differs from the fold, with the differing fields. */
  mismatches: Array<{ room: string; field: string; projection: unknown; fold: unknown }>;
  /** Rooms in the fold but not in `rooms`, or the reverse. */
  missing: string[];
  extra: string[];
  /** Applied events that do not fold (should be impossible). */
  inconsistent: Array<{ seq: number; reason: string }>;
  problems: string[];
  micros: number;
}

export interface PruneOptions {
  /** Whole terminal rooms that ended before this time (unix ms) go, with every event of theirs. */
  cutoffTs: number;
  /**
   * Events of no room (engine, recovery, system) before this time go too, but for the few a
   * control plane rebuilds from (prune.ts `KEPT_TYPES`). At most `cutoffTs`; absent: all kept.
   */
  eventsCutoffTs?: number;
  /** Rooms per transaction (default 500); events of no room: ten times as many. */
  chunkRooms?: number;
  /** Stops between chunks: what was deleted stays deleted, and is journaled. */
  signal?: AbortSignal;
  /** Called after each chunk with the totals so far (progress of a long prune). */
  onChunk?: (sofar: PruneResult) => void;
  /** Awaited between chunks: how a pass paces itself beside a serving load (retention.ts). */
  pause?: () => Promise<void>;
  /**
   * Each chunk is handed here before it is deleted, and deleted only once this resolves
   * (archive/segments.ts writes it to the archive): archive before delete.
   */
  archive?: (chunk: ArchiveChunk) => void | Promise<void>;
}

export interface PruneResult {
  cutoffTs: number;
  eventsCutoffTs: number | null;
  rooms: number;
  /** Events of the pruned rooms. */
  events: number;
  /** Events of no room deleted past `eventsCutoffTs`. */
  otherEvents: number;
  /** Transactions it took. */
  batches: number;
  /** Whether what it deleted was archived first (`PruneOptions.archive`). */
  archived: boolean;
}

/** What one chunk of retention deletes: rooms with every event of theirs, or events of no room. */
export interface ArchiveChunk {
  rooms: Room[];
  events: JournalEvent[];
}

/** What the journal takes on disk, and what is left there (what an alert predicts from). */
export interface JournalDisk {
  /** SQLite: the file and its WAL; PostgreSQL: its tables and indexes. */
  bytes: number;
  /** SQLite: free bytes on the journal's filesystem for its user; null where not known here. */
  freeBytes: number | null;
}

/**
 * The names a filter can match in this journal: the engines of its rooms and events, and the
 * reasons its rooms failed or were aborted for. Read only when a filter matched nothing
 * (filter-names.ts), to tell a name the journal does not hold from a quiet hour.
 */
export interface JournalNames {
  engines: string[];
  reasons: string[];
}

/** What a prune would delete (`--dry-run`). */
export interface PrunableCount {
  rooms: number;
  events: number;
  otherEvents: number;
}

export interface JournalHealth {
  state: 'starting' | 'ready' | 'draining' | 'closed' | 'failed';
  /** False after a failed commit, until one succeeds again. */
  writable: boolean;
  lastError: string | null;
  pending: number;
  committedSeq: number;
  /** Transactions committed by this process, and events in the last one (group-commit size). */
  commits: number;
  lastBatchSize: number;
  /** Times the writer thread died and was restarted (PostgreSQL: the writing session reopened). */
  writerRestarts: number;
  /** PostgreSQL: the leadership term this process writes under; null for SQLite (no terms). */
  term: number | null;
  /**
   * SQLite: the writing connection's `synchronous` as SQLite reports it — FULL at `power`
   * durability (each commit fsynced), NORMAL at `process` (docs/journal.md, "Durability").
   */
  synchronous?: string;
}

export interface Subscription {
  close(): void;
}

export type EventListener = (event: JournalEvent) => void;

export interface EngineBacklog {
  /** Committed events of the engine's rooms, oldest first (rejection records left out). */
  events: JournalEvent[];
  /** The newest committed seq when they were read: anything later arrives live. */
  headSeq: number;
}

/** A state checkpoint to store: what a control plane folded through `seq` (src/control/checkpoint). */
export interface CheckpointInput {
  name: string;
  seq: number;
  format: number;
  /** sha256 hex of `data`. */
  digest: string;
  data: string;
}

/** A state checkpoint as stored, with the schema it was written under and the journal's now. */
export interface StoredCheckpoint extends CheckpointInput {
  schemaVersion: number;
  currentSchemaVersion: number;
  /**
   * A migration applied since it was written that changed what events read back (`0008_name`;
   * src/journal/migrations.ts `keepsCheckpoints`), or null: the checkpoint is still the fold.
   */
  brokenBy: string | null;
  writtenAt: number;
}

/**
 * What the control plane and recovery hold: the log's write side, following it, and the reads
 * that run the fleet (an engine's hello, a restart's replay, the stall and outage checks). An
 * operator's query is not here: it is written once, for the API and the CLI (`JournalReader`).
 */
export interface JournalLog {
  /** Validates, appends and commits one event; resolves after COMMIT. */
  append(event: EventInput): Promise<AppendResult>;
  /**
   * Delivers every committed event with seq > afterSeq, in seq order, first from the journal
   * (catch-up) and then live, with no gap and no duplicate.
   */
  subscribe(afterSeq: number, listener: EventListener): Subscription;
  readFrom(afterSeq: number, limit: number): Promise<JournalEvent[]>;
  headSeq(): Promise<number>;
  /**
   * What an engine that says hello has missed. `liveOnly` (a fresh engine, by default when
   * `afterSeq` is 0): every event of its rooms that are not terminal. Otherwise: every event of
   * its rooms after `afterSeq` — terminal ones too, which a reconnecting engine must release.
   */
  engineBacklog(engine: string, afterSeq: number, liveOnly?: boolean): Promise<EngineBacklog>;
  /** Events by the filter; with `type`, typed as that type's events. */
  tail<T extends EventType = EventType>(filter: TailFilter<T>): Promise<JournalEventOf<T>[]>;
  /** Rooms by the filter (a start's orphans: those left in flight). */
  rooms(filter: RoomFilter): Promise<RoomPage>;
  /** The state checkpoint of that name as stored, unchecked (src/control/checkpoint checks it). */
  getCheckpoint(name: string): Promise<StoredCheckpoint | null>;
  /** Replaces the checkpoint of that name; the journal adds its schema version and the time. */
  setCheckpoint(checkpoint: CheckpointInput): Promise<void>;
  health(): JournalHealth;
  /** Waits for every pending append (at most `timeoutMs`), then closes. Idempotent. */
  drain(options?: { timeoutMs?: number }): Promise<void>;
}

/** What operators read, through the HTTP API and the CLI, on a journal open or read-only. */
export interface JournalReader {
  readFrom(afterSeq: number, limit: number): Promise<JournalEvent[]>;
  headSeq(): Promise<number>;
  timeline(room: string): Promise<Timeline>;
  rooms(filter: RoomFilter): Promise<RoomPage>;
  perMinute(window: { since: number; until: number }): Promise<MinuteCount[]>;
  /** Events by the filter; with `type`, typed as that type's events. */
  tail<T extends EventType = EventType>(filter: TailFilter<T>): Promise<JournalEventOf<T>[]>;
  stats(): Promise<JournalStats>;
  /** Every engine and reason a filter could match here, sorted (a scan: for an empty answer). */
  names(): Promise<JournalNames>;
  /** Bytes on disk and free beside them: cheap, for every metrics scrape. */
  diskUsage(): Promise<JournalDisk>;
  /**
   * What `prune` would delete: terminal rooms that ended before the cut-off and their events,
   * and events of no room before `eventsCutoffTs` (0 when absent).
   */
  countPrunable(cutoffTs: number, eventsCutoffTs?: number): Promise<PrunableCount>;
  verify(): Promise<VerifyReport>;
  /** The state checkpoint of that name as stored, unchecked (src/control/checkpoint checks it). */
  getCheckpoint(name: string): Promise<StoredCheckpoint | null>;
  close(): void;
}

/** A journal this process writes: both faces, and its upkeep (cursors, retention). */
export interface JournalStore extends JournalLog, JournalReader {
  getCursor(name: string): Promise<number | null>;
  setCursor(name: string, seq: number): Promise<void>;
  /**
   * Deletes whole terminal rooms whose terminal time is before `cutoffTs`, then events of no
   * room before `eventsCutoffTs`, a chunk per transaction, appends interleaving (prune.ts); a
   * prune that deleted anything journals `journal.pruned`.
   */
  prune(opts: PruneOptions): Promise<PruneResult>;
}

/** Events a page of `eachEvent` reads at once (`tail` allows at most 10,000). */
const EACH_PAGE = 5000;

/**
 * Calls `each` for every event `filter` selects, oldest first, reading page by page, until the
 * events run out or `each` returns false (true: go on).
 */
export async function eachEvent<T extends EventType>(
  reader: Pick<JournalReader, 'tail'>,
  filter: Omit<TailFilter<T>, 'order' | 'limit'>,
  each: (ev: JournalEventOf<T>) => boolean,
): Promise<void> {
  for await (const page of eventPages(reader, filter)) for (const ev of page) if (!each(ev)) return;
}

/** The events `filter` selects, oldest first, a page (up to 5,000) at a time. */
export async function* eventPages<T extends EventType>(
  reader: Pick<JournalReader, 'tail'>,
  filter: Omit<TailFilter<T>, 'order' | 'limit'>,
): AsyncGenerator<JournalEventOf<T>[]> {
  let afterSeq = filter.afterSeq ?? 0;
  for (;;) {
    const page = await reader.tail({ ...filter, afterSeq, order: 'oldest', limit: EACH_PAGE });
    if (page.length > 0) yield page;
    const last = page.at(-1);
    if (page.length < EACH_PAGE || !last) return;
    afterSeq = last.seq;
  }
}
