/**
 * Read queries over a journal file, on their own read-only connection (WAL lets them run while
 * the writer commits). Shared by the CLI and, later, the HTTP API through `JournalReader`.
 */
import { statfsSync, statSync } from 'node:fs';
import { dirname } from 'node:path';
import type Database from 'better-sqlite3';
import type { EventType, JournalEvent, JournalEventOf } from '../../room/events.ts';
import type { RoomState } from '../../room/states.ts';
import { PACK_SPAN_MS } from '../packs.ts';
import {
  backlogParams,
  type EventSql,
  journalNames,
  limitOf,
  namesSql,
  plainEventSql,
  RELEASED_BY_BOTH,
  roomPage,
  roomsQuery,
  spansOf,
  tailQuery,
} from '../queries.ts';
import {
  type CheckpointRow,
  checkpointFromRow,
  type EventRow,
  type RoomRow,
  rowToEvent,
  rowToRoom,
} from '../rows.ts';
import type {
  ArchiveChunk,
  EngineBacklog,
  JournalDisk,
  JournalNames,
  JournalReader,
  JournalStats,
  MinuteCount,
  PrunableCount,
  RoomFilter,
  RoomPage,
  StoredCheckpoint,
  TailFilter,
  Timeline,
  VerifyReport,
} from '../store.ts';
import {
  backlogOnRows,
  eventRowsSql,
  listsRequest,
  OTHER_EVENTS,
  REFUSED_NAME_ID,
} from './event-rows.ts';
import { loadMigrations } from './migrate.ts';
import { classifySqliteError, openDatabase } from './open.ts';
import {
  hasPacks,
  PACKED_BACKLOG,
  perMinuteCounts,
  tailInWindows,
  WindowedRead,
} from './packs/reads.ts';
import { HEAD_SEQ_SQL, PACKED_EVENTS } from './packs/sql.ts';
import { verifyJournal } from './verify.ts';

/** The view `events` for `tailQuery`: a room's events, rows and packs, found by its name. */
const VIEW_EVENTS = plainEventSql(listsRequest('data'));

export class SqliteReader implements JournalReader {
  readonly path: string;
  protected readonly db: Database.Database;
  private readonly events: EventSql;
  private pages: WindowedRead | undefined;

  constructor(path: string, db?: Database.Database) {
    this.path = path;
    this.db = db ?? openDatabase({ path, readonly: true });
    this.events = eventRowsSql(this.db);
  }

  /**
   * Runs a read in one read transaction, so that every query in it sees the same snapshot even
   * while a writer commits (verify reads events and rooms separately and must not see them at
   * different moments). SQLite's corruption errors become JOURNAL_CORRUPT.
   */
  protected read<T>(fn: () => T): Promise<T> {
    try {
      return Promise.resolve(this.db.inTransaction ? fn() : this.db.transaction(fn).deferred());
    } catch (err) {
      return Promise.reject(classifySqliteError(err, this.path));
    }
  }

  readFromSync(afterSeq: number, limit: number): JournalEvent[] {
    this.pages ??= new WindowedRead(this.db);
    return this.pages.page(afterSeq, limit).map(rowToEvent);
  }

  readFrom(afterSeq: number, limit: number): Promise<JournalEvent[]> {
    return this.read(() => this.readFromSync(afterSeq, limit));
  }

  engineBacklog(
    engine: string,
    afterSeq: number,
    liveOnly = afterSeq === 0,
  ): Promise<EngineBacklog> {
    return this.read(() => {
      const headSeq = this.db.prepare(HEAD_SEQ_SQL).pluck().get() as number;
      const rows = this.db
        .prepare(backlogOnRows(liveOnly))
        .all(...backlogParams(engine, afterSeq, headSeq, liveOnly)) as EventRow[];
      // Live rooms are never packed; rooms that ended since afterSeq may be.
      if (!liveOnly) {
        rows.push(
          ...(this.db.prepare(PACKED_BACKLOG).all({ engine, afterSeq, headSeq }) as EventRow[]),
        );
        rows.sort((a, b) => a.seq - b.seq);
      }
      return { events: rows.map(rowToEvent), headSeq };
    });
  }

  getCheckpoint(name: string): Promise<StoredCheckpoint | null> {
    return this.read(() => {
      const row = this.db
        .prepare(
          `SELECT c.*, (SELECT max(version) FROM schema_migrations) AS current_schema
             FROM state_checkpoints c WHERE name = ?`,
        )
        .get(name) as CheckpointRow | undefined;
      return row ? checkpointFromRow(row, loadMigrations()) : null;
    });
  }

  headSeq(): Promise<number> {
    return this.read(() => this.db.prepare(HEAD_SEQ_SQL).pluck().get() as number);
  }

  timeline(room: string): Promise<Timeline> {
    return this.read(() => {
      const row = this.db.prepare('SELECT * FROM rooms WHERE room = ?').get(room) as
        | RoomRow
        | undefined;
      const events = (
        this.db.prepare('SELECT * FROM events WHERE room = ? ORDER BY seq').all(room) as EventRow[]
      ).map(rowToEvent);
      return { room: row ? rowToRoom(row) : null, events, spans: spansOf(events) };
    });
  }

  rooms(filter: RoomFilter): Promise<RoomPage> {
    return this.read(() => {
      const q = roomsQuery(filter);
      const rows = this.db.prepare(q.sql).all(...q.params) as RoomRow[];
      return roomPage(rows.map(rowToRoom), q.limit);
    });
  }

  perMinute(window: { since: number; until: number }): Promise<MinuteCount[]> {
    return this.read(() => {
      return perMinuteCounts(this.db, window);
    });
  }

  tailSync(filter: TailFilter): JournalEvent[] {
    // A request's refusals are events of no room (never packed); a room's events the view finds
    // by its name in either place; any other filter walks rows and packs in windows of seqs.
    const packed = filter.requestId === undefined && filter.room === undefined && hasPacks(this.db);
    if (packed) {
      return tailInWindows(this.db, filter, {
        afterSeq: filter.afterSeq ?? 0,
        limit: limitOf(filter.limit, 50),
        newest: (filter.order ?? 'newest') === 'newest',
      });
    }
    const q = tailQuery(
      filter,
      filter.room !== undefined && hasPacks(this.db) ? VIEW_EVENTS : this.events,
    );
    const rows = this.db.prepare(q.sql).all(...q.params) as EventRow[];
    if (q.newest) rows.reverse();
    return rows.map(rowToEvent);
  }

  tail<T extends EventType = EventType>(filter: TailFilter<T>): Promise<JournalEventOf<T>[]> {
    // Rows of the filter's types only: what rowToEvent made is that type's event.
    return this.read(() => this.tailSync(filter) as JournalEventOf<T>[]);
  }

  stats(): Promise<JournalStats> {
    return this.read(() => {
      const db = this.db;
      const rows = db
        .prepare('SELECT count(*) AS n, min(seq) AS a, max(seq) AS b FROM event_rows')
        .get() as { n: number; a: number | null; b: number | null };
      const packs = db
        .prepare(
          `SELECT coalesce(sum(${PACKED_EVENTS}), 0) AS n, min(first_seq) AS a, max(last_seq) AS b
             FROM room_packs`,
        )
        .get() as { n: number; a: number | null; b: number | null };
      const ev = { n: rows.n + packs.n, a: least(rows.a, packs.a), b: most(rows.b, packs.b) };
      // Separate statements so that each min/max is one probe of an index.
      const first = least(
        db.prepare('SELECT min(ts) FROM event_rows').pluck().get() as number | null,
        db.prepare('SELECT min(first_ts) FROM room_packs').pluck().get() as number | null,
      );
      const last = most(
        db.prepare('SELECT max(ts) FROM event_rows').pluck().get() as number | null,
        db.prepare(PACKS_LAST_TS).pluck().get() as number | null,
      );
      const byState: Partial<Record<RoomState, number>> = {};
      let rooms = 0;
      for (const r of db
        .prepare('SELECT state, count(*) AS n FROM rooms GROUP BY state')
        .all() as Array<{
        state: RoomState;
        n: number;
      }>) {
        byState[r.state] = r.n;
        rooms += r.n;
      }
      const reasons = (state: string) =>
        Object.fromEntries(
          (
            db
              .prepare(
                'SELECT reason, count(*) AS n FROM rooms WHERE state = ? GROUP BY reason ORDER BY n DESC',
              )
              .all(state) as Array<{ reason: string; n: number }>
          ).map((r) => [r.reason, r.n]),
        );
      const eventsByType = Object.fromEntries(
        (
          db
            .prepare(
              `SELECT t.name AS type, count(*) AS n FROM (
                 SELECT type FROM event_rows
                 UNION ALL SELECT h.type FROM room_packs p, json_each(p.events) j
                   JOIN event_shapes h ON h.id = json_extract(j.value, '$[2]')) e
                 JOIN event_names t ON t.id = e.type GROUP BY e.type ORDER BY n DESC`,
            )
            .all() as Array<{
            type: string;
            n: number;
          }>
        ).map((r) => [r.type, r.n]),
      );
      const consumers = (
        db.prepare('SELECT name, seq, updated_at FROM consumers ORDER BY name').all() as Array<{
          name: string;
          seq: number;
          updated_at: number;
        }>
      ).map((c) => ({ name: c.name, seq: c.seq, updatedAt: c.updated_at }));
      const fileBytes = filesBytes(this.path);
      return {
        path: this.path,
        schemaVersion: db
          .prepare('SELECT max(version) FROM schema_migrations')
          .pluck()
          .get() as number,
        events: ev.n,
        firstSeq: ev.a,
        lastSeq: ev.b,
        firstTs: first,
        lastTs: last,
        rooms,
        packedRooms: db
          .prepare('SELECT count(DISTINCT room) FROM room_packs')
          .pluck()
          .get() as number,
        byState,
        failuresByReason: reasons('failed'),
        abortsByReason: reasons('aborted'),
        refusalsByReason: Object.fromEntries(
          (
            db
              .prepare(
                `SELECT json_extract(data, '$.reason') AS reason, sum(json_extract(data, '$.count')) AS n
                   FROM event_rows WHERE type = ${REFUSED_NAME_ID} GROUP BY reason ORDER BY n DESC`,
              )
              .all() as Array<{ reason: string; n: number }>
          ).map((r) => [r.reason, r.n]),
        ),
        rejectedEvents: eventsByType['room.event_rejected'] ?? 0,
        eventsByType,
        consumers,
        fileBytes,
      };
    });
  }

  /** What `prune` would delete: terminal rooms that ended before the cut-off, and their events. */
  /** Retention with an archive (journal/prune.ts): the next chunk of rooms, read in one snapshot. */
  pruneCandidates(
    cutoffTs: number,
    limit: number,
  ): Promise<{ chunk: ArchiveChunk; upToSeq: number }> {
    return this.read(() => {
      const rooms = (
        this.db
          .prepare(
            `SELECT * FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?
               AND ${RELEASED_BY_BOTH}
             ORDER BY terminal_at LIMIT ?`,
          )
          .all(cutoffTs, limit) as RoomRow[]
      ).map(rowToRoom);
      const byRoom = this.db.prepare('SELECT * FROM events WHERE room = ? ORDER BY seq');
      const events = rooms.flatMap((r) => (byRoom.all(r.room) as EventRow[]).map(rowToEvent));
      const upToSeq = this.db.prepare(HEAD_SEQ_SQL).pluck().get();
      return { chunk: { rooms, events }, upToSeq: upToSeq as number };
    });
  }

  /** Retention with an archive: the next events of no room before `cutoffTs`. */
  otherCandidates(cutoffTs: number, limit: number): Promise<JournalEvent[]> {
    return this.read(() =>
      (
        this.db
          .prepare(`SELECT * FROM (${OTHER_EVENTS}) ORDER BY ts LIMIT ?`)
          .all(cutoffTs, limit) as EventRow[]
      ).map(rowToEvent),
    );
  }

  diskUsage(): Promise<JournalDisk> {
    let freeBytes: number | null = null;
    try {
      const fs = statfsSync(dirname(this.path));
      freeBytes = fs.bavail * fs.bsize;
    } catch {
      // a filesystem that does not say: unknown
    }
    return Promise.resolve({ bytes: filesBytes(this.path), freeBytes });
  }

  countPrunable(cutoffTs: number, eventsCutoffTs?: number): Promise<PrunableCount> {
    return this.read(
      () =>
        this.db
          .prepare(
            `SELECT count(*) AS rooms,
                (SELECT count(*) FROM event_rows WHERE room IN
                   (SELECT k.id FROM rooms x JOIN event_rooms k ON k.room = x.room
                     WHERE x.terminal_at IS NOT NULL AND x.terminal_at < ? AND x.${RELEASED_BY_BOTH}))
                + (SELECT coalesce(sum(${PACKED_EVENTS}), 0) FROM room_packs WHERE room IN
                   (SELECT id FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?
                      AND ${RELEASED_BY_BOTH})) AS events,
                (SELECT count(*) FROM (${OTHER_EVENTS})) AS otherEvents
         FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ? AND ${RELEASED_BY_BOTH}`,
          )
          .get(cutoffTs, cutoffTs, eventsCutoffTs ?? 0, cutoffTs) as PrunableCount,
    );
  }

  names(): Promise<JournalNames> {
    return this.read(() => {
      const all = (sql: string) => this.db.prepare(sql).pluck().all() as string[];
      return journalNames(all(NAMES_SQL.engines), all(NAMES_SQL.reasons));
    });
  }

  verify(): Promise<VerifyReport> {
    return this.read(() => verifyJournal(this.db));
  }

  close(): void {
    if (this.db.open) this.db.close();
  }
}

/** Engine names are ids of `event_names`, in the rows and in the packs' shapes (0: none). */
const NAMES_SQL = namesSql(
  `SELECT name FROM event_names WHERE id IN (SELECT engine FROM event_rows WHERE engine IS NOT NULL
     UNION SELECT engine FROM event_shapes WHERE engine > 0)`,
);

/** The newest ts in a pack: among those that start within a pack's span of the latest start. */
const PACKS_LAST_TS = `SELECT max(last_ts) FROM room_packs
  WHERE first_ts >= (SELECT max(first_ts) FROM room_packs) - ${PACK_SPAN_MS}`;

function least(a: number | null, b: number | null): number | null {
  return a === null ? b : b === null ? a : Math.min(a, b);
}

function most(a: number | null, b: number | null): number | null {
  return a === null ? b : b === null ? a : Math.max(a, b);
}

/** The journal file and its WAL, bytes (a missing WAL is 0). */
function filesBytes(path: string): number {
  let bytes = 0;
  for (const suffix of ['', '-wal']) {
    try {
      bytes += statSync(path + suffix).size;
    } catch {
      // no WAL file is fine
    }
  }
  return bytes;
}
