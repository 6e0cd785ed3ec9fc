/**
 * The read queries every backend answers, in SQL both SQLite and PostgreSQL take: `?`
 * placeholders (PostgreSQL's reader numbers them), and helpers over their results.
 */

import type { JournalEvent } from '../room/events.ts';
import { type Room, reduce } from '../room/reducer.ts';
import { isTerminal, ROOM_STATES, type RoomState } from '../room/states.ts';
import { JournalError } from './errors.ts';
import type { JournalNames, MinuteCount, RoomFilter, StateSpan, TailFilter } from './store.ts';

export interface Query {
  sql: string;
  params: Array<string | number>;
}

/** The event type that enters each state, for per-minute counts. */
/**
 * SQL: the room was released by both its engines (`released_by` is a JSON array, and engine ids
 * hold no comma). Retention prunes only such rooms: one still awaiting a release is an engine's
 * work in the journal — an engine that reconnects is replayed its rooms from there, and a room
 * pruned before its release would never be freed (found by the simulator's SQLite journal).
 */
export const RELEASED_BY_BOTH = "released_by LIKE '%,%'";

/** A room released by both its engines (`RELEASED_BY_BOTH`, on a room in memory). */
export function releasedByBoth(r: Room): boolean {
  return (
    r.prefillEngine !== null &&
    r.decodeEngine !== null &&
    r.releasedBy.includes(r.prefillEngine) &&
    r.releasedBy.includes(r.decodeEngine)
  );
}

export const ENTERS: Record<string, RoomState> = {
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

export function limitOf(limit: number | undefined, fallback: number): number {
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

/** The (createdAt, room) a page cursor stands for; JOURNAL_BAD_QUERY for one no journal returned. */
export function decodeCursor(cursor: string): [number, string] {
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

const marks = (n: number) => Array.from({ length: n }, () => '?').join(', ');

/** A page of rooms, newest first: asks for limit + 1 rows to know whether another page follows. */
export function roomsQuery(filter: RoomFilter): Query & { limit: number } {
  const limit = limitOf(filter.limit, 100);
  const where: string[] = [];
  const params: Array<string | number> = [];
  const states = filter.state === undefined ? [] : [filter.state].flat();
  // Rooms in flight, or (at start) ended within minutes and not released: found by the partial
  // indexes (few rows, sorted after), not by walking every room in creation order (found timing
  // a start on 1 M rooms). A listing over a long window keeps the walk, which stops at its limit.
  const live = states.length > 0 && states.every((s) => !isTerminal(s));
  const endedSince =
    filter.unreleased === true &&
    states.length > 0 &&
    states.every((s) => isTerminal(s)) &&
    filter.since !== undefined;
  if (states.length > 0) {
    where.push(`state IN (${marks(states.length)})`);
    params.push(...states);
  }
  if (live) where.push('deadline_at IS NOT NULL');
  if (filter.engine !== undefined) {
    where.push('(prefill_engine = ? OR decode_engine = ?)');
    params.push(filter.engine, filter.engine);
  }
  if (filter.reason !== undefined) {
    where.push('reason = ?');
    params.push(filter.reason);
  }
  if (filter.requestId !== undefined) {
    where.push('request_id = ?');
    params.push(filter.requestId);
  }
  if (filter.tenant !== undefined) {
    where.push('tenant = ?');
    params.push(filter.tenant);
  }
  if (filter.until !== undefined) {
    where.push('created_at <= ?');
    params.push(filter.until);
  }
  if (filter.since !== undefined) {
    where.push(endedSince ? 'terminal_at >= ?' : '(terminal_at IS NULL OR terminal_at >= ?)');
    params.push(filter.since);
  }
  if (filter.unreleased) where.push(`NOT ${RELEASED_BY_BOTH}`);
  if (filter.inFlightAt !== undefined) {
    where.push('created_at <= ? AND (terminal_at IS NULL OR terminal_at > ?)');
    params.push(filter.inFlightAt, filter.inFlightAt);
  }
  for (const [list, op] of [
    [filter.origin, 'IN'],
    [filter.excludeOrigin, 'NOT IN'],
  ] as const) {
    if (list === undefined || list.length === 0) continue;
    where.push(`origin ${op} (${marks(list.length)})`);
    params.push(...list);
  }
  if (filter.cursor !== undefined) {
    const [createdAt, room] = decodeCursor(filter.cursor);
    where.push('(created_at < ? OR (created_at = ? AND room < ?))');
    params.push(createdAt, createdAt, room);
  }
  // `+created_at`: the order is not to choose the index when a partial one finds the rows.
  const order = live || endedSince ? '+created_at' : 'created_at';
  const sql = `SELECT * FROM rooms ${where.length ? `WHERE ${where.join(' AND ')}` : ''}
    ORDER BY ${order} DESC, room DESC LIMIT ?`;
  return { sql, params: [...params, limit + 1], limit };
}

/** The page from `roomsQuery`'s rows (already mapped to rooms). */
export function roomPage(
  rooms: Room[],
  limit: number,
): { rooms: Room[]; nextCursor: string | null } {
  const page = rooms.slice(0, limit);
  const last = page[page.length - 1];
  return { rooms: page, nextCursor: rooms.length > limit && last ? encodeCursor(last) : null };
}

/** Whether `ev` is a refusal (`request.refused`) that lists `requestId` among its first ids. */
export function refusalOf(ev: JournalEvent, requestId: string): boolean {
  if (ev.type !== 'request.refused') return false;
  return (ev.data as { requestIds?: string[] }).requestIds?.includes(requestId) === true;
}

/** The tail filter as a test of one event: the in-memory journal's, and a follower's of new events. */
export function tailMatcher(filter: TailFilter): (ev: JournalEvent) => boolean {
  const types =
    filter.type === undefined
      ? null
      : new Set<string>(Array.isArray(filter.type) ? filter.type : [filter.type]);
  return (ev) =>
    (types === null || types.has(ev.type)) &&
    (filter.room === undefined || ev.room === filter.room) &&
    (filter.engine === undefined || ev.engine === filter.engine) &&
    (filter.since === undefined || ev.ts >= filter.since) &&
    (filter.requestId === undefined || refusalOf(ev, filter.requestId));
}

/** A string as an SQL literal (both backends quote alike). */
function sqlText(s: string): string {
  return `'${s.replaceAll("'", "''")}'`;
}

/** How a backend's events are read and tested, for `tailQuery`. */
export interface EventSql {
  /** `SELECT … FROM …` giving the columns of `events`, with `seq`, `ts` and `data` as named here. */
  select: string;
  seq: string;
  ts: string;
  /**
   * A test that an event's type is one of `types`, with the names as literals: a partial index of
   * one type (events_refused) then serves it, where a parameter leaves the planner a walk of every
   * event from afterSeq on.
   */
  typeIn(types: readonly string[]): string;
  /** Tests against one `?` parameter: the event's room, its engine, a request id among its `requestIds`. */
  roomIs: string;
  engineIs: string;
  listsRequest: string;
}

/** `events` as a table with every column of its own (PostgreSQL's). */
export function plainEventSql(listsRequest: string): EventSql {
  return {
    select: 'SELECT * FROM events',
    seq: 'seq',
    ts: 'ts',
    typeIn: (types) =>
      types.length === 1
        ? `type = ${sqlText(types[0] as string)}`
        : `type IN (${types.map(sqlText).join(', ')})`,
    roomIs: 'room = ?',
    engineIs: 'engine = ?',
    listsRequest,
  };
}

/**
 * A tail's filter as SQL tests on the columns of `events` (every one but the seq, which
 * `tailQuery` adds first), with their parameters, its limit and its order.
 */
export function tailFilter(
  filter: TailFilter,
  sql: EventSql,
): { where: string[]; params: Array<string | number>; limit: number; newest: boolean } {
  const where: string[] = [];
  const params: Array<string | number> = [];
  if (filter.type !== undefined) {
    where.push(sql.typeIn(Array.isArray(filter.type) ? filter.type : [filter.type]));
  }
  if (filter.room !== undefined) {
    where.push(sql.roomIs);
    params.push(filter.room);
  }
  if (filter.engine !== undefined) {
    where.push(sql.engineIs);
    params.push(filter.engine);
  }
  if (filter.since !== undefined) {
    where.push(`${sql.ts} >= ?`);
    params.push(filter.since);
  }
  if (filter.requestId !== undefined) {
    where.push(sql.typeIn(['request.refused']), sql.listsRequest);
    params.push(filter.requestId);
  }
  const newest = (filter.order ?? 'newest') === 'newest';
  return { where, params, limit: limitOf(filter.limit, 50), newest };
}

/** Events by filter; rows come newest first when `newest` (reverse them). */
export function tailQuery(filter: TailFilter, sql: EventSql): Query & { newest: boolean } {
  const f = tailFilter(filter, sql);
  const where = [`${sql.seq} > ?`, ...f.where];
  return {
    sql: `${sql.select} WHERE ${where.join(' AND ')} ORDER BY ${sql.seq} ${f.newest ? 'DESC' : 'ASC'} LIMIT ?`,
    params: [filter.afterSeq ?? 0, ...f.params, f.limit],
    newest: f.newest,
  };
}

/**
 * Per-minute counts of states entered. `reasonOf` is the backend's expression for the `reason`
 * field of an event's JSON data; `from` what is read, `events` unless the backend narrows it to
 * the window itself (SQLite's packs: named parameters `@since` and `@until`).
 */
export function perMinuteQuery(
  window: { since: number; until: number },
  reasonOf: string,
  from = 'events',
): Query {
  const types = Object.keys(ENTERS);
  return {
    sql: `SELECT (ts / 60000) * 60000 AS minute, type,
            CASE WHEN type IN ('room.failed', 'room.aborted') THEN ${reasonOf} END AS reason,
            count(*) AS count
          FROM ${from}
          WHERE ts >= ? AND ts < ? AND type IN (${marks(types.length)})
          GROUP BY 1, 2, 3
          ORDER BY 1, 2, 3`,
    params: [window.since, window.until, ...types],
  };
}

/** A row of `perMinuteQuery`. */
export interface MinuteRow {
  minute: number;
  type: string;
  reason: string | null;
  count: number;
}

/**
 * Per-minute counts that the rows `perMinuteQuery` counted start, and that packed events add to as
 * a pack decoder meets them: `add` is its test (it counts, and keeps nothing to write out).
 */
export function minuteTally(rows: MinuteRow[]): {
  add: (e: { type: string; ts: number }, data: unknown) => false;
  counts: () => MinuteCount[];
} {
  const tally = new Map(rows.map((r) => [`${r.minute} ${r.type} ${r.reason}`, r]));
  return {
    add(e, data) {
      if (!(e.type in ENTERS)) return false;
      const minute = Math.floor(e.ts / 60_000) * 60_000;
      // A reason is in the data a pack holds (never a shared part).
      const reason =
        e.type === 'room.failed' || e.type === 'room.aborted'
          ? ((data as { reason?: string }).reason ?? null)
          : null;
      const key = `${minute} ${e.type} ${reason}`;
      const row = tally.get(key);
      if (row) row.count++;
      else tally.set(key, { minute, type: e.type, reason, count: 1 });
      return false;
    },
    counts: () => minuteCounts([...tally.values()]),
  };
}

export function minuteCounts(rows: MinuteRow[]): MinuteCount[] {
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
}

/**
 * `JournalReader.names()`: the engines of the rooms, with `eventEngines` (the backend's query of
 * its events' engine names) after them, and the reasons rooms ended for.
 */
export function namesSql(eventEngines: string): { engines: string; reasons: string } {
  return {
    engines: `SELECT prefill_engine AS name FROM rooms UNION SELECT decode_engine FROM rooms
                UNION ${eventEngines}`,
    reasons: 'SELECT DISTINCT reason AS name FROM rooms WHERE reason IS NOT NULL',
  };
}

/** Names in one order on every backend (PostgreSQL's ORDER BY follows its collation): by code unit. */
export function journalNames(engines: Iterable<string>, reasons: Iterable<string>): JournalNames {
  const sorted = (names: Iterable<string>) =>
    [...new Set(names)].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  return { engines: sorted(engines), reasons: sorted(reasons) };
}

/** Events of an engine's rooms an engine that says hello has missed (`JournalReader.engineBacklog`). */
export function backlogSql(liveOnly: boolean, from = 'events'): string {
  // Live rooms have a deadline (rooms_live_deadline); a fresh engine needs only theirs.
  return liveOnly
    ? `SELECT e.* FROM ${from} e WHERE e.room IN (SELECT room FROM rooms WHERE deadline_at IS NOT NULL
         AND (prefill_engine = ? OR decode_engine = ?))
       AND e.type <> 'room.event_rejected' AND e.seq <= ? ORDER BY e.seq`
    : `SELECT e.* FROM ${from} e JOIN rooms r ON r.room = e.room
       WHERE e.seq > ? AND e.seq <= ? AND (r.prefill_engine = ? OR r.decode_engine = ?)
       AND e.type <> 'room.event_rejected' ORDER BY e.seq`;
}

export function backlogParams(
  engine: string,
  afterSeq: number,
  headSeq: number,
  liveOnly: boolean,
): Array<string | number> {
  return liveOnly ? [engine, engine, headSeq] : [afterSeq, headSeq, engine, engine];
}
