/**
 * Read queries over a journal file, on their own read-only connection (WAL lets them run while
 * the writer commits). Shared by the CLI and, later, the HTTP API through `JournalReader`.
 */
import { statfsSync, statSync } from 'node:fs';
import { dirname } from 'node:path';
import type Database from 'better-sqlite3';
import type { EventType, JournalEvent, JournalEventOf } from '../events.ts';
import { keptTypes } from '../prune.ts';
import {
  backlogParams,
  type EventSql,
  minuteCounts,
  perMinuteQuery,
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
import type { RoomState } from '../states.ts';
import type {
  ArchiveChunk,
  EngineBacklog,
  JournalDisk,
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
import { backlogOnRows, eventRowsSql, REFUSED_NAME_ID } from './event-rows.ts';
import { loadMigrations } from './migrate.ts';
import { classifySqliteError, openDatabase } from './open.ts';
import { verifyJournal } from './verify.ts';

export class SqliteReader implements JournalReader {
  readonly path: string;
  protected readonly db: Database.Database;
  private readonly events: EventSql;

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
    const rows = this.db
      .prepare('SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?')
      .all(afterSeq, limit) as EventRow[];
    return rows.map(rowToEvent);
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
      const headSeq = this.db
        .prepare('SELECT coalesce(max(seq), 0) FROM event_rows')
        .pluck()
        .get() as number;
      const rows = this.db
        .prepare(backlogOnRows(liveOnly))
        .all(...backlogParams(engine, afterSeq, headSeq, liveOnly)) as EventRow[];
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
    return this.read(
      () => this.db.prepare('SELECT coalesce(max(seq), 0) FROM event_rows').pluck().get() as number,
    );
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
      const q = perMinuteQuery(window, "json_extract(data, '$.reason')");
      return minuteCounts(this.db.prepare(q.sql).all(...q.params) as never);
    });
  }

  tailSync(filter: TailFilter): JournalEvent[] {
    const q = tailQuery(filter, this.events);
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
      const ev = db
        .prepare('SELECT count(*) AS n, min(seq) AS a, max(seq) AS b FROM event_rows')
        .get() as { n: number; a: number | null; b: number | null };
      // Separate statements so that each min/max is one probe of the ts index.
      const first = db.prepare('SELECT min(ts) FROM event_rows').pluck().get() as number | null;
      const last = db.prepare('SELECT max(ts) FROM event_rows').pluck().get() as number | null;
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
              `SELECT t.name AS type, count(*) AS n FROM event_rows e
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
             ORDER BY terminal_at LIMIT ?`,
          )
          .all(cutoffTs, limit) as RoomRow[]
      ).map(rowToRoom);
      const byRoom = this.db.prepare('SELECT * FROM events WHERE room = ? ORDER BY seq');
      const events = rooms.flatMap((r) => (byRoom.all(r.room) as EventRow[]).map(rowToEvent));
      const upToSeq = this.db.prepare('SELECT coalesce(max(seq), 0) FROM event_rows').pluck().get();
      return { chunk: { rooms, events }, upToSeq: upToSeq as number };
    });
  }

  /** Retention with an archive: the next events of no room before `cutoffTs`. */
  otherCandidates(cutoffTs: number, limit: number): Promise<JournalEvent[]> {
    return this.read(() =>
      (
        this.db
          .prepare(
            `SELECT * FROM events e WHERE ts < ? AND type NOT IN (${keptTypes()})
               AND (room IS NULL OR NOT EXISTS (SELECT 1 FROM rooms r WHERE r.room = e.room))
             ORDER BY ts LIMIT ?`,
          )
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
                     WHERE x.terminal_at IS NOT NULL AND x.terminal_at < ?)) AS events,
                (SELECT count(*) FROM events e WHERE ts < ? AND type NOT IN (${keptTypes()})
                   AND (room IS NULL OR NOT EXISTS (SELECT 1 FROM rooms r WHERE r.room = e.room))) AS otherEvents
         FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?`,
          )
          .get(cutoffTs, eventsCutoffTs ?? 0, cutoffTs) as PrunableCount,
    );
  }

  verify(): Promise<VerifyReport> {
    return this.read(() => verifyJournal(this.db));
  }

  close(): void {
    if (this.db.open) this.db.close();
  }
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
