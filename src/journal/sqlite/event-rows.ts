/**
 * How schema 7 stores events (migrations/0007_compact_events.sql): rows in `event_rows` with the
 * type, source and engine as ids of `event_names`, the room as an id of `event_rooms`, and the part
 * of the data that rooms repeat in `event_shared`; the view `events` puts them back together for
 * humans and for every read that does not need an index.
 * pdctl writes `event_rows`, and reads it directly where a filter must reach an index by id.
 */
import type Database from 'better-sqlite3';
import { isObject, type Json, SHARED_KEYS, without } from '../packs.ts';
import { keptTypes } from '../prune.ts';
import type { EventSql } from '../queries.ts';

/** `event_names` id of `request.refused`, fixed by the migration: `events_refused` is on it. */
export const REFUSED_NAME_ID = 1;

/** The columns of the `events` view, from `event_rows e` joined to its names and shared parts. */
export const EVENT_SELECT = `SELECT e.seq, e.ts, t.name AS type, r.room AS room, g.name AS engine,
    s.name AS source, e.event_id,
    CASE WHEN e.shared IS NULL THEN e.data
         ELSE json_patch(e.data, (SELECT json FROM event_shared WHERE id = e.shared)) END AS data
  FROM event_rows e
  LEFT JOIN event_names t ON t.id = e.type
  LEFT JOIN event_rooms r ON r.id = e.room
  LEFT JOIN event_names g ON g.id = e.engine
  LEFT JOIN event_names s ON s.id = e.source`;

/**
 * Events of no room, or of a room without a `rooms` row (rejections of rooms that never existed),
 * with a ts before the first `?`, retention's kept types excepted: retention's events of no room.
 * From the rows alone, as the view's columns (a pack holds only a room's events).
 */
export const OTHER_EVENTS = `${EVENT_SELECT}
  WHERE e.ts < ? AND t.name NOT IN (${keptTypes()})
    AND (e.room IS NULL OR NOT EXISTS (SELECT 1 FROM rooms x WHERE x.room = r.room))`;

/** Not a rejection record (`IS NOT`: true as well where the journal never stored one). */
const NOT_REJECTED =
  "e.type IS NOT (SELECT id FROM event_names WHERE name = 'room.event_rejected')";

/**
 * queries.ts `backlogSql` on event_rows, with the same parameters (`backlogParams`): rooms reached
 * by their ids, so the planner walks the engine's rooms' events, not every event through the view.
 */
export function backlogOnRows(liveOnly: boolean): string {
  return liveOnly
    ? `${EVENT_SELECT}
       WHERE e.room IN (SELECT k.id FROM rooms x JOIN event_rooms k ON k.room = x.room
                         WHERE x.deadline_at IS NOT NULL AND (x.prefill_engine = ? OR x.decode_engine = ?))
         AND ${NOT_REJECTED} AND e.seq <= ? ORDER BY e.seq`
    : `${EVENT_SELECT} JOIN rooms x ON x.room = r.room
       WHERE e.seq > ? AND e.seq <= ? AND (x.prefill_engine = ? OR x.decode_engine = ?)
         AND ${NOT_REJECTED} ORDER BY e.seq`;
}

/**
 * The ids of a table of values stored once (`event_names`, `event_shared`, `event_shapes`): those
 * committed, and those the open batch added, which a rolled-back batch takes back. A value is its
 * column's text, or for a row of several columns (`event_shapes`) their values joined by commas.
 */
export class IdTable {
  private readonly committed: Map<string, number>;
  private added = new Map<string, number>();
  private readonly insert: (value: string) => number;

  /** `stored`: the committed values and their ids; `insert` stores a new value, giving its id. */
  constructor(stored: Iterable<[string, number]>, insert: (value: string) => number) {
    this.committed = new Map(stored);
    this.insert = insert;
  }

  /** The ids of a table of one value column. */
  static of(db: Database.Database, table: 'event_names' | 'event_shared', column: string): IdTable {
    const rows = db.prepare(`SELECT ${column}, id FROM ${table}`).raw().all() as Array<
      [string, number]
    >;
    const insert = db.prepare(`INSERT INTO ${table} (${column}) VALUES (?)`);
    return new IdTable(rows, (value) => Number(insert.run(value).lastInsertRowid));
  }

  /** The value's id, inserted inside the open transaction if it is new. */
  id(value: string): number {
    let id = this.committed.get(value) ?? this.added.get(value);
    if (id === undefined) {
      id = this.insert(value);
      this.added.set(value, id);
    }
    return id;
  }

  /** After COMMIT: what the batch added is stored. */
  commit(): void {
    for (const [value, id] of this.added) this.committed.set(value, id);
    this.added = new Map();
  }

  /** After a ROLLBACK (or a commit already merged): nothing the batch added stands. */
  rollback(): void {
    this.added = new Map();
  }
}

/** A test that the `requestIds` of the event data in `column` hold the `?` parameter (SQLite's JSON). */
export const listsRequest = (column: string): string =>
  `EXISTS (SELECT 1 FROM json_each(${column}, '$.requestIds') WHERE value = ?)`;

/** `tailQuery`'s view of event_rows on this database: types by id, rooms and engines by name. */
export function eventRowsSql(db: Database.Database): EventSql {
  const find = db.prepare('SELECT id FROM event_names WHERE name = ?').pluck();
  // Each name's id as an SQL literal; 0 (no id) for a name the journal never stored.
  const idsOf = (names: readonly string[]) =>
    names.map((n) => String((find.get(n) as number | undefined) ?? 0));
  return {
    select: EVENT_SELECT,
    seq: 'e.seq',
    ts: 'e.ts',
    typeIn: (types) => {
      const ids = idsOf(types);
      return ids.length === 1 ? `e.type = ${ids[0]}` : `e.type IN (${ids.join(', ')})`;
    },
    roomIs: 'e.room = (SELECT id FROM event_rooms WHERE room = ?)',
    engineIs: 'e.engine = (SELECT id FROM event_names WHERE name = ?)',
    listsRequest: listsRequest('e.data'),
  };
}

/** An event's data as `event_rows` stores it: the rest as JSON, and the shared part's JSON if any. */
export interface StoredData {
  data: string;
  shared: string | null;
}

/** `data` stored as it came. */
function whole(data: unknown): StoredData {
  return { data: JSON.stringify(data), shared: null };
}

/** A value json_patch gives back as it is: not null, and no object in it holds a null (RFC 7396). */
function patchesBack(value: unknown): boolean {
  if (value === null) return false;
  if (!isObject(value)) return true;
  for (const v of Object.values(value)) if (!patchesBack(v)) return false;
  return true;
}

/**
 * Splits `data` into the part shared across rooms (those of its type's shared keys it has) and
 * the rest — only where the view's json_patch of the two gives back exactly the text stored whole,
 * so a read never differs from what was appended; otherwise, or when it has none of them, it is
 * stored whole. json_patch keeps the rest's keys where they are and appends the part's new keys in
 * the part's order, so that holds when, in each object the split takes keys from, they were its
 * last keys in the order of SHARED_KEYS (and none holds a null, which a patch would delete).
 * Checked on the keys, without serializing or parsing again: this runs for every event appended.
 */
export function storedData(type: string, data: unknown): StoredData {
  const groups = SHARED_KEYS[type];
  if (groups === undefined || !isObject(data)) return whole(data);
  const found: Array<{ parent: readonly string[]; keys: string[] }> = [];
  for (const { parent, keys } of groups) {
    let at: unknown = data;
    for (const step of parent) at = isObject(at) ? at[step] : undefined;
    if (!isObject(at)) continue;
    const has = keys.filter((k) => at[k] !== undefined);
    if (has.length === 0) continue;
    const last = Object.keys(at).slice(-has.length);
    if (last.some((k, i) => k !== has[i]) || !has.every((k) => patchesBack(at[k]))) {
      return whole(data);
    }
    found.push({ parent, keys: has });
  }
  if (found.length === 0) return whole(data);
  let rest: Json = data;
  const part: Json = {};
  for (const { parent, keys } of found) {
    rest = without(rest, parent, keys);
    let from: Json = data;
    let to = part;
    for (const step of parent) {
      from = from[step] as Json;
      if (!isObject(to[step])) to[step] = {};
      to = to[step] as Json;
    }
    for (const k of keys) to[k] = from[k];
  }
  return { data: JSON.stringify(rest), shared: JSON.stringify(part) };
}
