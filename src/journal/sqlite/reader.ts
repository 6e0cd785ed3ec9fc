/**
 * Read queries over a journal file, on their own read-only connection (WAL lets them run while
 * the writer commits). Shared by the CLI and, later, the HTTP API through `JournalReader`.
 */
import { statSync } from 'node:fs';
import type Database from 'better-sqlite3';
import { JournalError } from '../errors.ts';
import type { JournalEvent } from '../events.ts';
import { type Room, reduce } from '../reducer.ts';
import { ROOM_STATES, type RoomState } from '../states.ts';
import type {
  EngineBacklog,
  JournalReader,
  JournalStats,
  MinuteCount,
  RoomFilter,
  RoomPage,
  StateSpan,
  TailFilter,
  Timeline,
  VerifyReport,
} from '../store.ts';
import { classifySqliteError, openDatabase } from './open.ts';
import { type EventRow, type RoomRow, rowToEvent, rowToRoom } from './rows.ts';
import { verifyJournal } from './verify.ts';

/** The event type that enters each state, for per-minute counts. */
const ENTERS: Record<string, RoomState> = {
  'room.created': 'created',
  'room.bootstrap_started': 'bootstrapping',
  'room.bootstrapped': 'waiting_for_input',
  'room.prefill_started': 'prefilling',
  'room.transfer_posted': 'transferring',
  'room.transfer_completed': 'transferred',
  'room.decode_started': 'decoding',
  'room.completed': 'completed',
  'room.aborted': 'aborted',
  'room.failed': 'failed',
  'room.migrated': 'migrated',
};

const MAX_LIMIT = 10_000;

function limitOf(limit: number | undefined, fallback: number): number {
  const n = limit ?? fallback;
  if (!Number.isInteger(n) || n < 1 || n > MAX_LIMIT) {
    throw new JournalError(
      'JOURNAL_BAD_QUERY',
      `limit must be an integer from 1 to ${MAX_LIMIT}, got ${n}`,
    );
  }
  return n;
}

function encodeCursor(room: Room): string {
  return Buffer.from(JSON.stringify([room.createdAt, room.room])).toString('base64url');
}

function decodeCursor(cursor: string): [number, string] {
  try {
    const v = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as unknown;
    if (Array.isArray(v) && typeof v[0] === 'number' && typeof v[1] === 'string')
      return [v[0], v[1]];
  } catch {
    // fall through to the coded error
  }
  throw new JournalError('JOURNAL_BAD_QUERY', 'cursor is not one this journal returned');
}

/** Time in each state, from a room's applied events in seq order. */
export function spansOf(events: JournalEvent[]): StateSpan[] {
  const spans: StateSpan[] = [];
  let room: Room | null = null;
  for (const ev of events) {
    if (ev.type === 'room.event_rejected') continue;
    const r = reduce(room, ev);
    if (!r.ok) continue;
    if (!room || r.room.state !== room.state) {
      const last = spans[spans.length - 1];
      if (last) {
        last.to = ev.ts;
        last.ms = ev.ts - last.from;
      }
      spans.push({ state: r.room.state, from: ev.ts, to: null, ms: null });
    }
    room = r.room;
  }
  return spans;
}

export class SqliteReader implements JournalReader {
  readonly path: string;
  protected readonly db: Database.Database;

  constructor(path: string, db?: Database.Database) {
    this.path = path;
    this.db = db ?? openDatabase({ path, readonly: true });
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

  engineBacklog(engine: string, afterSeq: number): Promise<EngineBacklog> {
    return this.read(() => {
      const headSeq = this.db
        .prepare('SELECT coalesce(max(seq), 0) FROM events')
        .pluck()
        .get() as number;
      // Live rooms have a deadline (rooms_live_deadline); a fresh engine needs only theirs.
      const sql =
        afterSeq === 0
          ? `SELECT e.* FROM events e WHERE e.room IN (SELECT room FROM rooms WHERE deadline_at IS NOT NULL
               AND (prefill_engine = @engine OR decode_engine = @engine))
             AND e.type <> 'room.event_rejected' AND e.seq <= @head ORDER BY e.seq`
          : `SELECT e.* FROM events e JOIN rooms r ON r.room = e.room
             WHERE e.seq > @after AND e.seq <= @head AND (r.prefill_engine = @engine OR r.decode_engine = @engine)
             AND e.type <> 'room.event_rejected' ORDER BY e.seq`;
      const rows = this.db
        .prepare(sql)
        .all({ engine, after: afterSeq, head: headSeq }) as EventRow[];
      return { events: rows.map(rowToEvent), headSeq };
    });
  }

  headSeq(): Promise<number> {
    return this.read(
      () => this.db.prepare('SELECT coalesce(max(seq), 0) FROM events').pluck().get() as number,
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
      const limit = limitOf(filter.limit, 100);
      const where: string[] = [];
      const params: Array<string | number> = [];
      if (filter.state !== undefined) {
        const states = Array.isArray(filter.state) ? filter.state : [filter.state];
        where.push(`state IN (${states.map(() => '?').join(', ')})`);
        params.push(...states);
      }
      if (filter.engine !== undefined) {
        where.push('(prefill_engine = ? OR decode_engine = ?)');
        params.push(filter.engine, filter.engine);
      }
      if (filter.reason !== undefined) {
        where.push('reason = ?');
        params.push(filter.reason);
      }
      if (filter.until !== undefined) {
        where.push('created_at <= ?');
        params.push(filter.until);
      }
      if (filter.since !== undefined) {
        where.push('(terminal_at IS NULL OR terminal_at >= ?)');
        params.push(filter.since);
      }
      if (filter.inFlightAt !== undefined) {
        where.push('created_at <= ? AND (terminal_at IS NULL OR terminal_at > ?)');
        params.push(filter.inFlightAt, filter.inFlightAt);
      }
      for (const [list, op] of [
        [filter.origin, 'IN'],
        [filter.excludeOrigin, 'NOT IN'],
      ] as const) {
        if (list === undefined || list.length === 0) continue;
        where.push(`origin ${op} (${list.map(() => '?').join(', ')})`);
        params.push(...list);
      }
      if (filter.cursor !== undefined) {
        const [createdAt, room] = decodeCursor(filter.cursor);
        where.push('(created_at < ? OR (created_at = ? AND room < ?))');
        params.push(createdAt, createdAt, room);
      }
      const sql = `SELECT * FROM rooms ${where.length ? `WHERE ${where.join(' AND ')}` : ''}
        ORDER BY created_at DESC, room DESC LIMIT ?`;
      const rows = this.db.prepare(sql).all(...params, limit + 1) as RoomRow[];
      const rooms = rows.slice(0, limit).map(rowToRoom);
      const last = rooms[rooms.length - 1];
      return { rooms, nextCursor: rows.length > limit && last ? encodeCursor(last) : null };
    });
  }

  perMinute(window: { since: number; until: number }): Promise<MinuteCount[]> {
    return this.read(() => {
      const types = Object.keys(ENTERS);
      const rows = this.db
        .prepare(
          `SELECT (ts / 60000) * 60000 AS minute, type,
                  CASE WHEN type IN ('room.failed', 'room.aborted')
                       THEN json_extract(data, '$.reason') END AS reason,
                  count(*) AS count
           FROM events
           WHERE ts >= ? AND ts < ? AND type IN (${types.map(() => '?').join(', ')})
           GROUP BY minute, type, reason
           ORDER BY minute, type, reason`,
        )
        .all(window.since, window.until, ...types) as Array<{
        minute: number;
        type: string;
        reason: string | null;
        count: number;
      }>;
      const order = (state: RoomState) => ROOM_STATES.indexOf(state);
      return rows
        .map((r) => ({
          minute: r.minute,
          state: ENTERS[r.type] as RoomState,
          reason: r.reason,
          count: r.count,
        }))
        .sort(
          (a, b) =>
            a.minute - b.minute ||
            order(a.state) - order(b.state) ||
            (a.reason ?? '').localeCompare(b.reason ?? ''),
        );
    });
  }

  tailSync(filter: TailFilter): JournalEvent[] {
    const limit = limitOf(filter.limit, 50);
    const where: string[] = ['seq > ?'];
    const params: Array<string | number> = [filter.afterSeq ?? 0];
    if (filter.type !== undefined) {
      const types = Array.isArray(filter.type) ? filter.type : [filter.type];
      where.push(`type IN (${types.map(() => '?').join(', ')})`);
      params.push(...types);
    }
    if (filter.room !== undefined) {
      where.push('room = ?');
      params.push(filter.room);
    }
    if (filter.engine !== undefined) {
      where.push('engine = ?');
      params.push(filter.engine);
    }
    if (filter.since !== undefined) {
      where.push('ts >= ?');
      params.push(filter.since);
    }
    const newest = (filter.order ?? 'newest') === 'newest';
    const rows = this.db
      .prepare(
        `SELECT * FROM events WHERE ${where.join(' AND ')} ORDER BY seq ${newest ? 'DESC' : 'ASC'} LIMIT ?`,
      )
      .all(...params, limit) as EventRow[];
    if (newest) rows.reverse();
    return rows.map(rowToEvent);
  }

  tail(filter: TailFilter): Promise<JournalEvent[]> {
    return this.read(() => this.tailSync(filter));
  }

  stats(): Promise<JournalStats> {
    return this.read(() => {
      const db = this.db;
      const ev = db
        .prepare('SELECT count(*) AS n, min(seq) AS a, max(seq) AS b FROM events')
        .get() as { n: number; a: number | null; b: number | null };
      // Separate statements so that each min/max is one probe of the ts index.
      const first = db.prepare('SELECT min(ts) FROM events').pluck().get() as number | null;
      const last = db.prepare('SELECT max(ts) FROM events').pluck().get() as number | null;
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
            .prepare('SELECT type, count(*) AS n FROM events GROUP BY type ORDER BY n DESC')
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
      let fileBytes = 0;
      for (const suffix of ['', '-wal']) {
        try {
          fileBytes += statSync(this.path + suffix).size;
        } catch {
          // no WAL file is fine
        }
      }
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
        rejectedEvents: eventsByType['room.event_rejected'] ?? 0,
        eventsByType,
        consumers,
        fileBytes,
      };
    });
  }

  /** What `prune` would delete: terminal rooms that ended before the cut-off, and their events. */
  countPrunable(cutoffTs: number): { rooms: number; events: number } {
    return this.db
      .prepare(
        `SELECT count(*) AS rooms,
                (SELECT count(*) FROM events WHERE room IN
                   (SELECT room FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?)) AS events
         FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?`,
      )
      .get(cutoffTs, cutoffTs) as { rooms: number; events: number };
  }

  verify(): Promise<VerifyReport> {
    return this.read(() => verifyJournal(this.db));
  }

  close(): void {
    if (this.db.open) this.db.close();
  }
}
