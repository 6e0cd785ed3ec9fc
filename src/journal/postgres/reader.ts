/**
 * Read queries over a PostgreSQL journal, on a small pool of their own. Reads that must agree
 * with each other (verify, an engine's backlog) run in one REPEATABLE READ transaction.
 */
import pg from 'pg';
import type { EventType, JournalEvent, JournalEventOf } from '../../room/events.ts';
import type { RoomState } from '../../room/states.ts';
import { JournalError } from '../errors.ts';
import { mergeBySeq, PACK_KEY_BYTES, PACK_SPAN_MS } from '../packs.ts';
import { keptTypes } from '../prune.ts';
import {
  backlogParams,
  backlogSql,
  journalNames,
  type MinuteRow,
  minuteTally,
  namesSql,
  perMinuteQuery,
  plainEventSql,
  type Query,
  RELEASED_BY_BOTH,
  roomPage,
  roomsQuery,
  spansOf,
  tailFilter,
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
import { cursorProblems, FOLD_PAGE, JournalFold, ProjectionCheck } from '../verify.ts';
import { classifyPgError, clientConfig, redactUrl } from './connect.ts';
import { pgMigrations, pgSchemaVersion } from './migrate.ts';
import { eventsInWindows, PackDecoder, type Run } from './packs/reads.ts';
import { HEAD_SEQ_SQL, PACKED_EVENTS } from './packs/sql.ts';

/** Engine names in the rows and in the packs' shapes. */
const NAMES_SQL = namesSql(
  `SELECT engine FROM event_rows WHERE engine IS NOT NULL
     UNION SELECT engine FROM event_shapes WHERE engine IS NOT NULL`,
);

/**
 * `event_rows` for tailQuery, where a tail by request id reads (`request.refused` has no room, so
 * it is never packed): a request id among an event's `requestIds` by jsonb containment. A tail by
 * room reads the view, which finds a room's packs by `room_packs_room`.
 */
const REQUEST_ID = "(data::jsonb -> 'requestIds') @> jsonb_build_array(?::text)";
const ROWS = { ...plainEventSql(REQUEST_ID), select: 'SELECT * FROM event_rows' };
const VIEW = plainEventSql(REQUEST_ID);

/** `?` placeholders (the shared queries) as PostgreSQL's `$1, $2, …`. */
export function numbered(sql: string): string {
  let i = 0;
  return sql.replace(/\?/g, () => `$${++i}`);
}

export class PgReader implements JournalReader {
  /** The URL without its password: what messages and `stats().path` show. */
  readonly path: string;
  protected readonly pool: pg.Pool;

  /**
   * Whether its schema is yet to be checked: a reader of the query commands (`checkSchema`)
   * refuses a journal of an older or newer schema with what to do, where its queries would fail
   * on a missing column. Checked once it was found right.
   */
  private schemaUnchecked: boolean;

  constructor(
    protected readonly url: string,
    options: { applicationName?: string; max?: number; checkSchema?: boolean } = {},
  ) {
    this.schemaUnchecked = options.checkSchema === true;
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
    if (this.schemaUnchecked) await this.checkSchema();
    try {
      return (await this.pool.query<R>(numbered(sql), params)).rows;
    } catch (err) {
      throw classifyPgError(err, this.url);
    }
  }

  /** Runs `fn` in one read-only snapshot. */
  protected async snapshot<T>(fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
    if (this.schemaUnchecked) await this.checkSchema();
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

  private async checkSchema(): Promise<void> {
    let c: pg.PoolClient;
    try {
      c = await this.pool.connect();
    } catch (err) {
      throw classifyPgError(err, this.url);
    }
    let version: number | null;
    try {
      version = await pgSchemaVersion(c);
    } catch (err) {
      throw classifyPgError(err, this.url);
    } finally {
      c.release();
    }
    const head = pgMigrations().length;
    // 0 (no tables yet) and null (not a journal) are left to the queries' own errors.
    if (version !== null && version > head) {
      throw new JournalError(
        'JOURNAL_VERSION_CONFLICT',
        `${this.path} has journal schema ${version}, newer than this pdctl knows (${head}); upgrade pdctl to read it (nothing was modified)`,
      );
    }
    if (version !== null && version > 0 && version < head) {
      throw new JournalError(
        'JOURNAL_VERSION_CONFLICT',
        `${this.path} has journal schema ${version}, older than this pdctl's ${head}; a control plane of this version migrates it as it takes the lead, or run \`pdctl journal migrate --journal ${this.path}\` with every control plane on it stopped (nothing was modified)`,
      );
    }
    this.schemaUnchecked = false;
  }

  /** `sql` with `?` placeholders, on the pool: what packs/reads.ts reads through. */
  protected readonly run: Run = (sql, params) =>
    this.query({ sql, params: params as Array<string | number> });
  /** Shapes and shared ends, read once: a decoder for the pool's reads. */
  private readonly packs = new PackDecoder(this.run);

  async readFrom(afterSeq: number, limit: number): Promise<JournalEvent[]> {
    const rows = await eventsInWindows(this.run, this.packs, { afterSeq, limit, newest: false });
    return rows.map(rowToEvent);
  }

  engineBacklog(
    engine: string,
    afterSeq: number,
    liveOnly = afterSeq === 0,
  ): Promise<EngineBacklog> {
    return this.snapshot(async (c) => {
      const headSeq = await headOf(c);
      // Live rooms are never packed: their events are rows. Since a seq, rows and packs.
      const rows = (
        await c.query<EventRow>(
          numbered(backlogSql(liveOnly, 'event_rows')),
          backlogParams(engine, afterSeq, headSeq, liveOnly),
        )
      ).rows;
      const packed = liveOnly
        ? []
        : await new PackDecoder(onSnapshot(c)).window(
            { lo: afterSeq, hi: headSeq },
            (e) => e.type !== 'room.event_rejected',
            { engine },
          );
      const events = mergeBySeq<EventRow>(rows, packed, (e) => e.seq);
      return { events: events.map(rowToEvent), headSeq };
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
    const [r] = await this.query<{ head: number }>(HEAD_SEQ_SQL);
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
    const rows = await this.query<MinuteRow>(
      perMinuteQuery(window, "(data::json ->> 'reason')", 'event_rows'),
    );
    const tally = minuteTally(rows);
    await new PackDecoder(this.run).timeWindow(window, tally.add);
    return tally.counts();
  }

  async tail<T extends EventType = EventType>(filter: TailFilter<T>): Promise<JournalEventOf<T>[]> {
    let rows: EventRow[];
    if (filter.requestId !== undefined || filter.room !== undefined) {
      const q = tailQuery(filter, filter.room !== undefined ? VIEW : ROWS);
      rows = await this.query<EventRow>(q);
      if (q.newest) rows.reverse();
    } else {
      // Types, engine, time: in windows of seqs (packs/reads.ts), from a time's first seq on.
      const f = tailFilter(filter, ROWS);
      const floor =
        filter.since === undefined
          ? 0
          : ((
              await this.query<{ seq: number }>({
                sql: SINCE_SEQ_SQL,
                params: [filter.since, filter.since, filter.since],
              })
            )[0]?.seq ?? 0);
      const types =
        filter.type === undefined ? null : new Set<string>([filter.type].flat() as string[]);
      rows = await eventsInWindows(this.run, this.packs, {
        afterSeq: Math.max(filter.afterSeq ?? 0, floor),
        limit: f.limit,
        newest: f.newest,
        where: f.where.join(' AND '),
        params: f.params,
        keep: (e) =>
          (types === null || types.has(e.type)) &&
          (filter.engine === undefined || e.engine === filter.engine) &&
          (filter.since === undefined || e.ts >= filter.since),
        shapes:
          types === null && filter.engine === undefined
            ? undefined
            : (h) =>
                (types === null || types.has(h.type)) &&
                (filter.engine === undefined || h.engine === filter.engine),
      });
    }
    // Rows of the filter's types only: what rowToEvent made is that type's event.
    return rows.map(rowToEvent) as JournalEventOf<T>[];
  }

  stats(): Promise<JournalStats> {
    return this.snapshot(async (c) => {
      const one = async <R extends pg.QueryResultRow>(sql: string, params: unknown[] = []) =>
        (await c.query<R>(sql, params)).rows;
      // Rows and packs apart: a pack's bounds are its columns, its count its keys' length.
      const [ev] = await one<{ n: number; a: number | null; b: number | null }>(
        `SELECT (SELECT count(*) FROM event_rows)
                  + (SELECT coalesce(sum(${PACKED_EVENTS}), 0) FROM room_packs)::bigint AS n,
                least((SELECT min(seq) FROM event_rows), (SELECT min(first_seq) FROM room_packs)) AS a,
                greatest((SELECT max(seq) FROM event_rows), (SELECT max(last_seq) FROM room_packs)) AS b`,
      );
      const [ts] = await one<{ first: number | null; last: number | null }>(
        `SELECT least((SELECT min(ts) FROM event_rows), (SELECT min(first_ts) FROM room_packs)) AS first,
                greatest((SELECT max(ts) FROM event_rows), (SELECT max(last_ts) FROM room_packs)) AS last`,
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
      // Events by type and by term: the rows', and the packs' by shape (one read of each pack).
      const byTypeTerm = await one<{ type: string | null; term: number | null; n: number }>(
        `SELECT type, term, count(*) AS n FROM event_rows GROUP BY 1, 2
         UNION ALL
         SELECT h.type, h.term, s.n FROM (
           SELECT (j ->> 2)::integer AS shape, count(*) AS n
             FROM room_packs p, json_array_elements(p.events) j GROUP BY 1) s
           LEFT JOIN event_shapes h ON h.id = s.shape`,
      );
      const sum = (key: (r: (typeof byTypeTerm)[number]) => string | number | null) => {
        const totals = new Map<string | number, number>();
        for (const r of byTypeTerm) {
          const k = key(r);
          if (k !== null) totals.set(k, (totals.get(k) ?? 0) + r.n);
        }
        return totals;
      };
      const eventsByType = Object.fromEntries(
        [...sum((r) => r.type)].sort((a, b) => b[1] - a[1]),
      ) as Record<string, number>;
      const byTerm = sum((r) => r.term);
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
        }>('SELECT term, holder, acquired_at, how, previous FROM leader_terms ORDER BY term')
      ).map((r) => ({
        term: r.term,
        holder: r.holder,
        acquiredAt: r.acquired_at,
        how: r.how,
        previous: r.previous,
        events: byTerm.get(r.term) ?? 0,
      }));
      const [size] = await one<{ bytes: number }>(TABLES_BYTES_SQL);
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
                 FROM event_rows WHERE type = 'request.refused' GROUP BY 1 ORDER BY n DESC`,
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
             AND ${RELEASED_BY_BOTH}
           ORDER BY terminal_at LIMIT $2`,
          [cutoffTs, limit],
        )
      ).rows.map(rowToRoom);
      const events = (
        await c.query<EventRow>('SELECT * FROM events WHERE room = ANY($1::text[]) ORDER BY seq', [
          rooms.map((r) => r.room),
        ])
      ).rows.map(rowToEvent);
      return { chunk: { rooms, events }, upToSeq: await headOf(c) };
    });
  }

  /** Retention with an archive: the next events of no room before `cutoffTs`. */
  async otherCandidates(cutoffTs: number, limit: number): Promise<JournalEvent[]> {
    const rows = await this.query<EventRow>({
      // Events of no room, or of a room gone: rows (a pack goes with its room).
      sql: `SELECT * FROM event_rows e WHERE ts < ? AND type NOT IN (${keptTypes()})
              AND (room IS NULL OR NOT EXISTS (SELECT 1 FROM rooms r WHERE r.room = e.room))
            ORDER BY ts LIMIT ?`,
      params: [cutoffTs, limit],
    });
    return rows.map(rowToEvent);
  }

  async names(): Promise<JournalNames> {
    const all = async (sql: string) => (await this.query<{ name: string }>(sql)).map((r) => r.name);
    return journalNames(await all(NAMES_SQL.engines), await all(NAMES_SQL.reasons));
  }

  async diskUsage(): Promise<JournalDisk> {
    const [r] = await this.query<{ bytes: number }>(TABLES_BYTES_SQL);
    // The database server's disk is not this process's to see: watch it where it runs.
    return { bytes: r?.bytes ?? 0, freeBytes: null };
  }

  async countPrunable(cutoffTs: number, eventsCutoffTs?: number): Promise<PrunableCount> {
    const [r] = await this.query<PrunableCount>({
      sql: `SELECT count(*) AS rooms,
              (SELECT count(*) FROM event_rows WHERE room IN
                 (SELECT room FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?
                   AND ${RELEASED_BY_BOTH}))
                + (SELECT coalesce(sum(${PACKED_EVENTS}), 0) FROM room_packs WHERE room IN
                 (SELECT room FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?
                   AND ${RELEASED_BY_BOTH}))::bigint AS events,
              (SELECT count(*) FROM event_rows e WHERE ts < ? AND type NOT IN (${keptTypes()})
                 AND (room IS NULL OR NOT EXISTS (SELECT 1 FROM rooms r WHERE r.room = e.room))) AS "otherEvents"
            FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ? AND ${RELEASED_BY_BOTH}`,
      params: [cutoffTs, cutoffTs, eventsCutoffTs ?? 0, cutoffTs],
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
      // Every event and its term, a window of seqs at a time (packs/reads.ts); a packed event
      // whose shape is missing is left out, and packProblems names its pack.
      const run = onSnapshot(c);
      const packs = new PackDecoder(run, { ids: false });
      let newest: number | null = null;
      let backwards = 0;
      let term = 0;
      for (;;) {
        const rows = await eventsInWindows(run, packs, {
          afterSeq: fold.lastSeq,
          limit: FOLD_PAGE,
          newest: false,
          ids: false,
        });
        for (const e of rows) {
          if (e.term < term) backwards++;
          term = e.term;
          newest = Math.max(newest ?? e.term, e.term);
        }
        fold.add(rows.map((e) => [e.seq, e.ts, e.type, e.room, e.engine, e.source, e.data]));
        if (rows.length < FOLD_PAGE) break;
      }
      const problems: string[] = [];
      const [current] = (
        await c.query<{ term: number }>('SELECT term FROM leadership WHERE id = 1')
      ).rows;
      if (current && newest !== null && newest > current.term) {
        problems.push(`events carry term ${newest}, newer than the current term ${current.term}`);
      }
      if (backwards > 0) {
        problems.push(`${backwards} event(s) carry an older term than the event before them`);
      }
      problems.push(...(await packProblems(c)));
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

/** Queries with `?` placeholders in one snapshot's session. */
function onSnapshot(c: pg.ClientBase): Run {
  return async (sql, params) => (await c.query(numbered(sql), params)).rows;
}

async function headOf(c: pg.ClientBase): Promise<number> {
  const r = await c.query<{ head: number }>(HEAD_SEQ_SQL);
  return r.rows[0]?.head ?? 0;
}

/** The bytes of the journal's tables and their indexes. */
const TABLES_BYTES_SQL = `SELECT (pg_total_relation_size('event_rows') + pg_total_relation_size('room_packs')
    + pg_total_relation_size('event_shapes') + pg_total_relation_size('event_suffixes')
    + pg_total_relation_size('rooms')
    + pg_total_relation_size('consumers'))::bigint AS bytes`;

/** The seq before the first event with a ts at or after `?` (three times), rows or packs. */
const SINCE_SEQ_SQL = `SELECT least(
    coalesce((SELECT min(seq) FROM event_rows WHERE ts >= ?), ${Number.MAX_SAFE_INTEGER}),
    coalesce((SELECT min(first_seq) FROM room_packs
               WHERE first_ts >= ?::bigint - ${PACK_SPAN_MS} AND last_ts >= ?), ${Number.MAX_SAFE_INTEGER})
  ) - 1 AS seq`;

/**
 * What the packs hold wrong, for verify: a room that has no row, keys not 16 bytes an event, a
 * seq outside the pack's bounds, a shape or suffix that `event_shapes` or `event_suffixes` lacks.
 */
async function packProblems(c: pg.ClientBase): Promise<string[]> {
  const [r] = (
    await c.query<{
      orphans: number;
      damaged: number;
      first_damaged: number | null;
      dangling: number;
      first_dangling: number | null;
    }>(
      `WITH d AS (
         SELECT p.first_seq,
                bool_or((j.e ->> 0)::bigint < 0 OR p.first_seq + (j.e ->> 0)::bigint > p.last_seq)
                  OR length(p.keys) <> ${PACK_KEY_BYTES} * count(*) AS damaged,
                bool_or(h.id IS NULL OR (h.suffix IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM event_suffixes x WHERE x.id = h.suffix))) AS dangling
           FROM room_packs p
           CROSS JOIN LATERAL json_array_elements(p.events) AS j (e)
           LEFT JOIN event_shapes h ON h.id = (j.e ->> 2)::integer
          GROUP BY p.first_seq, p.last_seq, p.keys)
       SELECT (SELECT count(*) FROM room_packs p WHERE NOT EXISTS (SELECT 1 FROM rooms r WHERE r.room = p.room)) AS orphans,
              count(*) FILTER (WHERE damaged) AS damaged, min(first_seq) FILTER (WHERE damaged) AS first_damaged,
              count(*) FILTER (WHERE dangling) AS dangling, min(first_seq) FILTER (WHERE dangling) AS first_dangling
         FROM d`,
    )
  ).rows;
  const problems: string[] = [];
  if (!r) return problems;
  if (r.orphans > 0) problems.push(`${r.orphans} packs of room_packs name no row of rooms`);
  if (r.damaged > 0) {
    problems.push(
      `${r.damaged} packs of room_packs are damaged (keys missing, or a seq outside their bounds), first at seq ${r.first_damaged}`,
    );
  }
  if (r.dangling > 0) {
    problems.push(
      `${r.dangling} packs of room_packs refer to a shape or suffix that event_shapes or event_suffixes lacks, first at seq ${r.first_dangling}`,
    );
  }
  return problems;
}
