/**
 * Read queries over a PostgreSQL journal, on a small pool of their own. Reads that must agree
 * with each other (verify, an engine's backlog) run in one REPEATABLE READ transaction.
 */
import pg from 'pg';
import type { EventType, JournalEvent, JournalEventOf } from '../events.ts';
import { keptTypes } from '../prune.ts';
import {
  backlogParams,
  backlogSql,
  minuteCounts,
  perMinuteQuery,
  plainEventSql,
  type Query,
  roomPage,
  roomsQuery,
  spansOf,
  tailQuery,
} from '../queries.ts';
import {
  type CheckpointRow,
  checkpointFromRow,
  type EventRow,
  ROOM_COLUMNS,
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
import {
  cursorProblems,
  FOLD_COLUMNS,
  FOLD_PAGE,
  type FoldRow,
  JournalFold,
  ProjectionCheck,
} from '../verify.ts';
import { classifyPgError, clientConfig, redactUrl } from './connect.ts';
import { pgMigrations, pgSchemaVersion } from './migrate.ts';

/** PostgreSQL's `events` for tailQuery: a request id among an event's `requestIds` by jsonb containment. */
const EVENTS = plainEventSql("(data::jsonb -> 'requestIds') @> jsonb_build_array(?::text)");

/** `?` placeholders (the shared queries) as PostgreSQL's `$1, $2, …`. */
export function numbered(sql: string): string {
  let i = 0;
  return sql.replace(/\?/g, () => `$${++i}`);
}

export class PgReader implements JournalReader {
  /** The URL without its password: what messages and `stats().path` show. */
  readonly path: string;
  protected readonly pool: pg.Pool;

  constructor(
    protected readonly url: string,
    options: { applicationName?: string; max?: number } = {},
  ) {
    this.path = redactUrl(url);
    this.pool = new pg.Pool({
      ...clientConfig({ url, applicationName: options.applicationName ?? 'pdctl reader' }),
      max: options.max ?? 4,
      idleTimeoutMillis: 30_000,
    });
    // An idle pooled connection that dies (server restart) must not crash the process; the next
    // query opens a new one.
    this.pool.on('error', () => {});
  }

  protected async query<R extends pg.QueryResultRow>(q: Query | string): Promise<R[]> {
    const { sql, params } = typeof q === 'string' ? { sql: q, params: [] } : q;
    try {
      return (await this.pool.query<R>(numbered(sql), params)).rows;
    } catch (err) {
      throw classifyPgError(err, this.url);
    }
  }

  /** Runs `fn` in one read-only snapshot. */
  protected async snapshot<T>(fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
    let c: pg.PoolClient;
    try {
      c = await this.pool.connect();
    } catch (err) {
      throw classifyPgError(err, this.url);
    }
    try {
      await c.query('BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY');
      const out = await fn(c);
      await c.query('COMMIT');
      return out;
    } catch (err) {
      await c.query('ROLLBACK').catch(() => {});
      throw classifyPgError(err, this.url);
    } finally {
      c.release();
    }
  }

  async readFrom(afterSeq: number, limit: number): Promise<JournalEvent[]> {
    const rows = await this.query<EventRow>({
      sql: 'SELECT * FROM events WHERE seq > ? ORDER BY seq LIMIT ?',
      params: [afterSeq, limit],
    });
    return rows.map(rowToEvent);
  }

  engineBacklog(
    engine: string,
    afterSeq: number,
    liveOnly = afterSeq === 0,
  ): Promise<EngineBacklog> {
    return this.snapshot(async (c) => {
      const headSeq = await headOf(c);
      const rows = (
        await c.query<EventRow>(
          numbered(backlogSql(liveOnly)),
          backlogParams(engine, afterSeq, headSeq, liveOnly),
        )
      ).rows;
      return { events: rows.map(rowToEvent), headSeq };
    });
  }

  async getCheckpoint(name: string): Promise<StoredCheckpoint | null> {
    // A reader does not migrate: a journal its leader keeps at an older schema has no table.
    const [t] = await this.query<{ present: boolean }>(
      "SELECT to_regclass('state_checkpoints') IS NOT NULL AS present",
    );
    if (!t?.present) return null;
    const [r] = await this.query<CheckpointRow>({
      sql: `SELECT c.*, (SELECT max(version) FROM schema_migrations) AS current_schema
              FROM state_checkpoints c WHERE name = ?`,
      params: [name],
    });
    return r ? checkpointFromRow(r, pgMigrations()) : null;
  }

  async headSeq(): Promise<number> {
    const [r] = await this.query<{ head: number }>(
      'SELECT coalesce(max(seq), 0) AS head FROM events',
    );
    return r?.head ?? 0;
  }

  timeline(room: string): Promise<Timeline> {
    return this.snapshot(async (c) => {
      const [row] = (await c.query<RoomRow>('SELECT * FROM rooms WHERE room = $1', [room])).rows;
      const events = (
        await c.query<EventRow>('SELECT * FROM events WHERE room = $1 ORDER BY seq', [room])
      ).rows.map(rowToEvent);
      return { room: row ? rowToRoom(row) : null, events, spans: spansOf(events) };
    });
  }

  async rooms(filter: RoomFilter): Promise<RoomPage> {
    const q = roomsQuery(filter);
    return roomPage((await this.query<RoomRow>(q)).map(rowToRoom), q.limit);
  }

  async perMinute(window: { since: number; until: number }): Promise<MinuteCount[]> {
    return minuteCounts(await this.query(perMinuteQuery(window, "(data::json ->> 'reason')")));
  }

  async tail<T extends EventType = EventType>(filter: TailFilter<T>): Promise<JournalEventOf<T>[]> {
    const q = tailQuery(filter, EVENTS);
    const rows = await this.query<EventRow>(q);
    if (q.newest) rows.reverse();
    // Rows of the filter's types only: what rowToEvent made is that type's event.
    return rows.map(rowToEvent) as JournalEventOf<T>[];
  }

  stats(): Promise<JournalStats> {
    return this.snapshot(async (c) => {
      const one = async <R extends pg.QueryResultRow>(sql: string, params: unknown[] = []) =>
        (await c.query<R>(sql, params)).rows;
      const [ev] = await one<{ n: number; a: number | null; b: number | null }>(
        'SELECT count(*) AS n, min(seq) AS a, max(seq) AS b FROM events',
      );
      const [ts] = await one<{ first: number | null; last: number | null }>(
        'SELECT (SELECT min(ts) FROM events) AS first, (SELECT max(ts) FROM events) AS last',
      );
      const byState: Partial<Record<RoomState, number>> = {};
      let rooms = 0;
      for (const r of await one<{ state: RoomState; n: number }>(
        'SELECT state, count(*) AS n FROM rooms GROUP BY state',
      )) {
        byState[r.state] = r.n;
        rooms += r.n;
      }
      const reasons = async (state: string) =>
        Object.fromEntries(
          (
            await one<{ reason: string; n: number }>(
              'SELECT reason, count(*) AS n FROM rooms WHERE state = $1 GROUP BY reason ORDER BY n DESC',
              [state],
            )
          ).map((r) => [r.reason, r.n]),
        );
      const eventsByType = Object.fromEntries(
        (
          await one<{ type: string; n: number }>(
            'SELECT type, count(*) AS n FROM events GROUP BY type ORDER BY n DESC',
          )
        ).map((r) => [r.type, r.n]),
      );
      const consumers = (
        await one<{ name: string; seq: number; updated_at: number }>(
          'SELECT name, seq, updated_at FROM consumers ORDER BY name',
        )
      ).map((r) => ({ name: r.name, seq: r.seq, updatedAt: r.updated_at }));
      const leaders = (
        await one<{
          term: number;
          holder: string;
          acquired_at: number;
          how: string;
          previous: string | null;
          events: number;
        }>(
          `SELECT t.term, t.holder, t.acquired_at, t.how, t.previous,
             (SELECT count(*) FROM events e WHERE e.term = t.term) AS events
           FROM leader_terms t ORDER BY t.term`,
        )
      ).map((r) => ({
        term: r.term,
        holder: r.holder,
        acquiredAt: r.acquired_at,
        how: r.how,
        previous: r.previous,
        events: r.events,
      }));
      const [size] = await one<{ bytes: number }>(
        `SELECT (pg_total_relation_size('events') + pg_total_relation_size('rooms')
                 + pg_total_relation_size('consumers'))::bigint AS bytes`,
      );
      return {
        path: this.path,
        schemaVersion: (await pgSchemaVersion(c)) ?? 0,
        events: ev?.n ?? 0,
        firstSeq: ev?.a ?? null,
        lastSeq: ev?.b ?? null,
        firstTs: ts?.first ?? null,
        lastTs: ts?.last ?? null,
        rooms,
        byState,
        failuresByReason: await reasons('failed'),
        abortsByReason: await reasons('aborted'),
        refusalsByReason: Object.fromEntries(
          (
            await one<{ reason: string; n: number }>(
              `SELECT data::jsonb ->> 'reason' AS reason, sum((data::jsonb ->> 'count')::bigint)::bigint AS n
                 FROM events WHERE type = 'request.refused' GROUP BY 1 ORDER BY n DESC`,
            )
          ).map((r) => [r.reason, Number(r.n)]),
        ),
        rejectedEvents: eventsByType['room.event_rejected'] ?? 0,
        eventsByType,
        consumers,
        fileBytes: size?.bytes ?? 0,
        leaders,
      };
    });
  }

  /** Retention with an archive (journal/prune.ts): the next chunk of rooms, read in one snapshot. */
  pruneCandidates(
    cutoffTs: number,
    limit: number,
  ): Promise<{ chunk: ArchiveChunk; upToSeq: number }> {
    return this.snapshot(async (c) => {
      const rooms = (
        await c.query<RoomRow>(
          `SELECT * FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < $1
           ORDER BY terminal_at LIMIT $2`,
          [cutoffTs, limit],
        )
      ).rows.map(rowToRoom);
      const events = (
        await c.query<EventRow>('SELECT * FROM events WHERE room = ANY($1::text[]) ORDER BY seq', [
          rooms.map((r) => r.room),
        ])
      ).rows.map(rowToEvent);
      const [head] = (
        await c.query<{ head: number }>('SELECT coalesce(max(seq), 0) AS head FROM events')
      ).rows;
      return { chunk: { rooms, events }, upToSeq: head?.head ?? 0 };
    });
  }

  /** Retention with an archive: the next events of no room before `cutoffTs`. */
  async otherCandidates(cutoffTs: number, limit: number): Promise<JournalEvent[]> {
    const rows = await this.query<EventRow>({
      sql: `SELECT * FROM events e WHERE ts < ? AND type NOT IN (${keptTypes()})
              AND (room IS NULL OR NOT EXISTS (SELECT 1 FROM rooms r WHERE r.room = e.room))
            ORDER BY ts LIMIT ?`,
      params: [cutoffTs, limit],
    });
    return rows.map(rowToEvent);
  }

  async diskUsage(): Promise<JournalDisk> {
    const [r] = await this.query<{ bytes: number }>(
      `SELECT (pg_total_relation_size('events') + pg_total_relation_size('rooms')
               + pg_total_relation_size('consumers'))::bigint AS bytes`,
    );
    // The database server's disk is not this process's to see: watch it where it runs.
    return { bytes: r?.bytes ?? 0, freeBytes: null };
  }

  async countPrunable(cutoffTs: number, eventsCutoffTs?: number): Promise<PrunableCount> {
    const [r] = await this.query<PrunableCount>({
      sql: `SELECT count(*) AS rooms,
              (SELECT count(*) FROM events WHERE room IN
                 (SELECT room FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?)) AS events,
              (SELECT count(*) FROM events e WHERE ts < ? AND type NOT IN (${keptTypes()})
                 AND (room IS NULL OR NOT EXISTS (SELECT 1 FROM rooms r WHERE r.room = e.room))) AS "otherEvents"
            FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?`,
      params: [cutoffTs, eventsCutoffTs ?? 0, cutoffTs],
    });
    return r ?? { rooms: 0, events: 0, otherEvents: 0 };
  }

  /**
   * The fold of every event compared with `rooms`, in one snapshot; plus the bookkeeping only
   * PostgreSQL has: every event carries a term no newer than the current one, and terms never go
   * down as seq goes up (a deposed leader never wrote after its successor).
   */
  verify(): Promise<VerifyReport> {
    return this.snapshot(async (c) => {
      const started = process.hrtime.bigint();
      const fold = new JournalFold();
      for (;;) {
        const r = await c.query({
          text: `SELECT ${FOLD_COLUMNS} FROM events WHERE seq > $1 ORDER BY seq LIMIT $2`,
          values: [fold.lastSeq, FOLD_PAGE],
          rowMode: 'array',
        });
        fold.add(r.rows as FoldRow[]);
        if (r.rows.length < FOLD_PAGE) break;
      }
      const problems: string[] = [];
      const [terms] = (
        await c.query<{ current: number; newest: number | null; backwards: number }>(
          `SELECT (SELECT term FROM leadership WHERE id = 1) AS current,
                  (SELECT max(term) FROM events) AS newest,
                  (SELECT count(*) FROM (SELECT term < lag(term) OVER (ORDER BY seq) AS back FROM events) t
                    WHERE back) AS backwards`,
        )
      ).rows;
      if (terms && terms.newest !== null && terms.newest > terms.current) {
        problems.push(
          `events carry term ${terms.newest}, newer than the current term ${terms.current}`,
        );
      }
      if (terms && terms.backwards > 0) {
        problems.push(`${terms.backwards} event(s) carry an older term than the event before them`);
      }
      const cursors = (
        await c.query<{ name: string; seq: number }>('SELECT name, seq FROM consumers')
      ).rows;
      problems.push(...cursorProblems(cursors, fold.lastSeq));
      const check = new ProjectionCheck(fold);
      const rooms = await c.query({
        text: `SELECT ${ROOM_COLUMNS.join(', ')} FROM rooms`,
        rowMode: 'array',
      });
      for (const row of rooms.rows as Array<Array<string | number | null>>) check.row(row);
      // Page-level checks are the server's (data checksums, amcheck): not repeated, and not claimed.
      return check.report('not checked here: PostgreSQL checks its own pages', problems, started);
    });
  }

  close(): void {
    void this.pool.end().catch(() => {});
  }
}

async function headOf(c: pg.ClientBase): Promise<number> {
  const r = await c.query<{ head: number }>('SELECT coalesce(max(seq), 0) AS head FROM events');
  return r.rows[0]?.head ?? 0;
}
