/**
 * How schema 7 stores events (migrations/0007_compact_events.sql): rows in `event_rows` with the
 * type, source and engine as ids of `event_names`, the room as an id of `event_rooms`, and the part
 * of the data that rooms repeat in `event_shared`; the view `events` puts them back together for
 * humans and for every read that does not need an index.
 * pdctl writes `event_rows`, and reads it directly where a filter must reach an index by id.
 */
import type Database from 'better-sqlite3';
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
 * The ids of a table of values stored once (`event_names`, `event_shared`): those committed, and
 * those the open batch added, which a rolled-back batch takes back.
 */
export class IdTable {
  private readonly committed = new Map<string, number>();
  private added = new Map<string, number>();
  private readonly insert: Database.Statement;

  constructor(db: Database.Database, table: 'event_names' | 'event_shared', column: string) {
    const rows = db.prepare(`SELECT id, ${column} FROM ${table}`).raw().all() as Array<
      [number, string]
    >;
    for (const [id, value] of rows) this.committed.set(value, id);
    this.insert = db.prepare(`INSERT INTO ${table} (${column}) VALUES (?)`);
  }

  /** The value's id, inserted inside the open transaction if it is new. */
  id(value: string): number {
    let id = this.committed.get(value) ?? this.added.get(value);
    if (id === undefined) {
      id = Number(this.insert.run(value).lastInsertRowid);
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
    listsRequest: "EXISTS (SELECT 1 FROM json_each(e.data, '$.requestIds') WHERE value = ?)",
  };
}

/**
 * The keys of an event's data that repeat across rooms, by type, in the order the view patches
 * them back (migration 0007 splits the same ones): stored once in `event_shared`.
 */
const SHARED_KEYS: Readonly<Record<string, ReadonlyArray<readonly string[]>>> = {
  'room.created': [
    ['reservation', 'decode', 'pool'],
    ['reservation', 'decode', 'epoch'],
    ['reservation', 'decode', 'incarnation'],
    ['deadlinesMs'],
  ],
  'room.bootstrapped': [['pool'], ['epoch']],
};

/** An event's data as `event_rows` stores it: the rest as JSON, and the shared part's JSON if any. */
export interface StoredData {
  data: string;
  shared: string | null;
}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** SQLite's json_patch (RFC 7396) on parsed JSON: a key it has is replaced in place, a new one appended. */
function jsonPatch(target: unknown, patch: unknown): unknown {
  if (!isObject(patch)) return patch;
  const out = isObject(target) ? target : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = jsonPatch(out[k], v);
  }
  return out;
}

/**
 * Splits `data` into the part shared across rooms and the rest — only where the view's
 * json_patch of the two gives back exactly the text stored whole (keys in the same order), so a
 * read never differs from what was appended; otherwise it is stored whole.
 */
export function storedData(type: string, data: unknown): StoredData {
  const whole = JSON.stringify(data);
  const paths = SHARED_KEYS[type];
  if (paths === undefined) return { data: whole, shared: null };
  const rest = JSON.parse(whole) as Json;
  const part: Json = {};
  for (const path of paths) {
    let from: unknown = rest;
    let to = part;
    for (const key of path.slice(0, -1)) {
      from = isObject(from) ? from[key] : undefined;
      if (!isObject(to[key])) to[key] = {};
      to = to[key] as Json;
    }
    const key = path[path.length - 1] as string;
    if (!isObject(from) || !(key in from)) return { data: whole, shared: null };
    to[key] = from[key];
    delete from[key];
  }
  const restText = JSON.stringify(rest);
  if (JSON.stringify(jsonPatch(JSON.parse(restText), part)) !== whole) {
    return { data: whole, shared: null };
  }
  return { data: restText, shared: JSON.stringify(part) };
}
