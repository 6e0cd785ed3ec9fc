/**
 * Reads of events that packs may hold (schema 8): in windows of seqs or of time, the packs decoded
 * here rather than by SQLite's JSON functions, never an unpacking of every pack.
 */
import type Database from 'better-sqlite3';
import type { JournalEvent } from '../../../room/events.ts';
import {
  mergeBySeq,
  PACK_KEY_BYTES,
  PACK_SPAN_MS,
  PACK_SPAN_SEQS,
  seqWindows,
  TEXT_TAG,
  takeInto,
} from '../../packs.ts';
import { type MinuteRow, minuteTally, perMinuteQuery } from '../../queries.ts';
import { type EventRow, rowToEvent } from '../../rows.ts';
import type { MinuteCount, TailFilter } from '../../store.ts';
import { FOLD_COLUMNS, type FoldRow } from '../../verify.ts';
import { EVENT_SELECT } from '../event-rows.ts';
import { HEAD_SEQ_SQL, PACKED_SELECT } from './sql.ts';

/**
 * Reads events after a seq in windows of seqs, so that a read from far back never unpacks more
 * than its window: `page(afterSeq, limit)` gives the next `limit` events (fewer at the head), as
 * rows of the view. Where no pack holds a seq after `afterSeq` — every read of recent events — it
 * reads the rows alone, as before packs; packs it decodes here (PackDecoder), which takes a
 * tenth of the time SQLite's JSON functions take to unpack them.
 */
export class WindowedRead<Row extends EventRow | FoldRow = EventRow> {
  private readonly rowsOnly: Database.Statement;
  private readonly rowsIn: Database.Statement;
  private readonly packsAfter: Database.Statement;
  private readonly head: Database.Statement;
  /** What the packs read so far hold wrong (PackDecoder), for verify. */
  readonly packs: PackDecoder;
  private readonly seqOf: (row: Row) => number;
  private readonly fromPack: (row: EventRow) => Row;

  /** `fold`: rows as verify folds them (FoldRow arrays); otherwise as the view's rows. */
  constructor(db: Database.Database, fold?: 'fold') {
    const rowsOnly = `${EVENT_SELECT} WHERE e.seq > ? ORDER BY e.seq LIMIT ?`;
    const rowsIn = `${EVENT_SELECT} WHERE e.seq > @lo AND e.seq <= @hi ORDER BY e.seq`;
    if (fold) {
      // Arrays of the fold's columns straight from SQLite: no object a row (verify's pace).
      const columns = (sql: string) => db.prepare(`SELECT ${FOLD_COLUMNS} FROM (${sql})`).raw();
      this.rowsOnly = columns(rowsOnly);
      this.rowsIn = columns(rowsIn);
      this.seqOf = (row) => (row as FoldRow)[0];
      this.fromPack = (r) => [r.seq, r.ts, r.type, r.room, r.engine, r.source, r.data] as Row;
    } else {
      this.rowsOnly = db.prepare(rowsOnly);
      this.rowsIn = db.prepare(rowsIn);
      this.seqOf = (row) => (row as EventRow).seq;
      this.fromPack = (r) => r as Row;
    }
    this.packsAfter = db.prepare('SELECT 1 FROM room_packs WHERE last_seq > ? LIMIT 1').pluck();
    this.head = db.prepare(HEAD_SEQ_SQL).pluck();
    this.packs = new PackDecoder(db);
  }

  page(afterSeq: number, limit: number): Row[] {
    if (this.packsAfter.get(afterSeq) === undefined) {
      return this.rowsOnly.all(afterSeq, limit) as Row[];
    }
    const head = this.head.get() as number;
    const out: Row[] = [];
    // Windows about as wide as the page: a pack is decoded once for each window it meets.
    const width = Math.max(limit * 2, 1024);
    for (let lo = afterSeq; lo < head; lo += width) {
      const window = { lo, hi: Math.min(lo + width, head) };
      const rows = this.rowsIn.all(window) as Row[];
      const packed = this.packs.window(window).map(this.fromPack);
      for (const row of mergeBySeq(rows, packed, this.seqOf)) {
        out.push(row);
        if (out.length === limit) return out;
      }
    }
    return out;
  }
}

/**
 * Packs decoded in JavaScript into the view's rows: the same columns and values as the view's
 * packed half (migrations/0008_room_packs.sql), its shared parts patched back as `json_patch`
 * does (RFC 7396: a key the part adds goes last, as the writer took it from there). `data` is the
 * JSON of the patched value: what JSON.parse of the view's text gives back, not its bytes. An
 * event whose type or source names nothing is left out, and its pack counted `dangling`.
 */
export class PackDecoder {
  private readonly packs: Database.Statement;
  private readonly packsInTime: Database.Statement;
  private readonly names = new Map<number, string>();
  private readonly nameOf: Database.Statement;
  private readonly sharedOf: Database.Statement;
  private readonly shared = new Map<number, Record<string, unknown>>();
  private readonly shapeOf: Database.Statement;
  private readonly shapes = new Map<number, Shape>();
  /**
   * Packs found damaged (not JSON, keys not 16 bytes an event, a text id missing, a seq outside
   * its bounds: left out) and events naming an id their table lacks (read as the view's LEFT JOIN
   * reads them), by the pack's first seq: what `journal verify` reports.
   */
  readonly damaged = new Set<number>();
  readonly dangling = new Set<number>();

  constructor(db: Database.Database) {
    this.packs = db
      .prepare(
        `SELECT p.first_seq, p.last_seq, p.first_ts, r.room, p.events, p.keys FROM room_packs p
           JOIN rooms r ON r.id = p.room
          WHERE p.last_seq > @lo AND p.last_seq <= @hi + ${PACK_SPAN_SEQS} AND p.first_seq <= @hi`,
      )
      .raw();
    this.packsInTime = db
      .prepare(
        `SELECT p.first_seq, p.last_seq, p.first_ts, r.room, p.events, p.keys FROM room_packs p
           JOIN rooms r ON r.id = p.room
          WHERE p.first_ts >= @since - ${PACK_SPAN_MS} AND p.first_ts < @until`,
      )
      .raw();
    this.nameOf = db.prepare('SELECT name FROM event_names WHERE id = ?').pluck();
    this.sharedOf = db.prepare('SELECT json FROM event_shared WHERE id = ?').pluck();
    this.shapeOf = db
      .prepare('SELECT type, engine, source, shared, key_tag FROM event_shapes WHERE id = ?')
      .raw();
  }

  /**
   * The packed events with `lo < seq <= hi`, in seq order; with `keep`, only those it keeps
   * (tested before their data is patched and written out).
   */
  window(w: { lo: number; hi: number }, keep?: Keep): EventRow[] {
    return this.decode(this.packs.all(w) as PackRow[], (e) => e.seq > w.lo && e.seq <= w.hi, keep);
  }

  /** The packed events with `since <= ts < until`, in seq order; `keep` as for `window`. */
  timeWindow(w: { since: number; until: number }, keep?: Keep): EventRow[] {
    return this.decode(
      this.packsInTime.all(w) as PackRow[],
      (e) => e.ts >= w.since && e.ts < w.until,
      keep,
    );
  }

  private decode(packs: PackRow[], inWindow: Keep, keep?: Keep): EventRow[] {
    const out: EventRow[] = [];
    for (const [firstSeq, lastSeq, firstTs, room, text, keys] of packs) {
      const events = this.parse(text);
      if (!events || keys.length !== PACK_KEY_BYTES * events.length) {
        this.damaged.add(firstSeq);
        continue;
      }
      let dangling = false;
      const name = (id: number): string | null => {
        const n = this.name(id);
        if (n === null) dangling = true;
        return n;
      };
      for (let k = 0; k < events.length; k++) {
        const [dseq, dts, shapeId, data, textId] = events[k] as PackedEvent;
        const seq = firstSeq + dseq;
        if (dseq < 0 || seq > lastSeq) this.damaged.add(firstSeq);
        const shape = this.shape(shapeId);
        if (shape === null) {
          dangling = true; // the view's LEFT JOIN: no type, so the fold could not take it
          continue;
        }
        const [type, engine, source, shared, keyTag] = shape;
        if (keyTag === TEXT_TAG && typeof textId !== 'string') this.damaged.add(firstSeq);
        const part = shared === 0 ? undefined : this.sharedPart(shared);
        if (part === null) dangling = true;
        const typeName = name(type);
        const sourceName = name(source);
        // An event of no known type or source is left out (the fold could not take it).
        if (typeName === null || sourceName === null) continue;
        const head = {
          seq,
          ts: firstTs + dts,
          type: typeName,
          room,
          engine: engine === 0 ? null : name(engine),
          source: sourceName,
        };
        if (!inWindow(head, data) || (keep && !keep(head, data))) continue;
        out.push({
          ...head,
          event_id:
            keyTag === TEXT_TAG
              ? Buffer.concat([Buffer.of(TEXT_TAG), Buffer.from(String(textId), 'utf8')])
              : Buffer.concat([
                  Buffer.of(keyTag === 1 ? 1 : 0),
                  keys.subarray(PACK_KEY_BYTES * k, PACK_KEY_BYTES * (k + 1)),
                ]),
          // A shared part its table lacks: json_patch with NULL gives NULL, as in the view.
          data: part === null ? (null as unknown as string) : JSON.stringify(patched(data, part)),
        });
      }
      if (dangling) this.dangling.add(firstSeq);
    }
    return out.sort((a, b) => a.seq - b.seq);
  }

  private parse(text: string): PackedEvent[] | null {
    try {
      const events = JSON.parse(text) as unknown;
      return Array.isArray(events) && events.every(Array.isArray)
        ? (events as PackedEvent[])
        : null;
    } catch {
      return null;
    }
  }

  private name(id: number): string | null {
    let name = this.names.get(id);
    if (name === undefined) {
      name = this.nameOf.get(id) as string | undefined;
      if (name === undefined) return null; // the view's LEFT JOIN
      this.names.set(id, name);
    }
    return name;
  }

  /** A shape by id (type, engine, source, shared part, key tag); null when its table lacks it. */
  private shape(id: number): Shape | null {
    let shape = this.shapes.get(id);
    if (shape === undefined) {
      shape = this.shapeOf.get(id) as Shape | undefined;
      if (shape === undefined) return null;
      this.shapes.set(id, shape);
    }
    return shape;
  }

  /** The shared part by id, parsed; null when its table lacks it. */
  private sharedPart(id: number): Record<string, unknown> | null {
    let part = this.shared.get(id);
    if (part === undefined) {
      const json = this.sharedOf.get(id) as string | undefined;
      if (json === undefined) return null;
      part = JSON.parse(json) as Record<string, unknown>;
      this.shared.set(id, part);
    }
    return part;
  }
}

/**
 * A test of a decoded event before its data is patched and written out: its columns, and its
 * data as the pack holds it (without the shared part).
 */
type Keep = (row: Omit<EventRow, 'data' | 'event_id'>, stored: unknown) => boolean;

/** A pack as PackDecoder reads it. */
type PackRow = [
  firstSeq: number,
  lastSeq: number,
  firstTs: number,
  room: string,
  events: string,
  keys: Buffer,
];

/** One event of a pack, as its JSON array holds it (packer.ts `packText`). */
type PackedEvent = [dseq: number, dts: number, shape: number, data: unknown, textId?: string];

/** A row of `event_shapes`: type, engine (0: none), source, shared part (0: none), key tag. */
type Shape = [type: number, engine: number, source: number, shared: number, keyTag: number];

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function patched(data: unknown, part: Record<string, unknown> | undefined): unknown {
  return part === undefined ? data : mergePatch(data, part);
}

/** RFC 7396 merge patch, as SQLite's json_patch: `target` is a fresh value (changed in place). */
function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isObject(patch)) return patch;
  const out = isObject(target) ? target : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/** Whether the journal holds any pack: where it does not, every read goes to the rows as before. */
export function hasPacks(db: Database.Database): boolean {
  return db.prepare('SELECT 1 FROM room_packs LIMIT 1').pluck().get() !== undefined;
}

/** A filter on the view's columns, with its named parameters. */
interface ViewFilter {
  where: string;
  params: Record<string, string | number>;
}

/**
 * The `limit` newest (or oldest after `afterSeq`) events that pass `filter`, rows and packs, in
 * windows of seqs that widen while they find little: a rare type walks the history a window at a
 * time, a common one stops in the first. Rows are filtered by SQLite, packs as they are decoded
 * (type, engine, time: the filters that send a tail here; a room's or a request's do not).
 * In seq order.
 */
export function tailInWindows(
  db: Database.Database,
  filter: TailFilter,
  opts: { afterSeq: number; limit: number; newest: boolean },
): JournalEvent[] {
  const { where, params } = viewFilter(filter);
  const rowsIn = db.prepare(
    `SELECT * FROM (${EVENT_SELECT} WHERE e.seq > @lo AND e.seq <= @hi)
      ${where ? `WHERE ${where}` : ''} ORDER BY seq`,
  );
  const packs = new PackDecoder(db);
  const types =
    filter.type === undefined ? null : new Set<string>([filter.type].flat() as string[]);
  const keep = (e: { type: string; engine: string | null; ts: number }) =>
    (types === null || types.has(e.type)) &&
    (filter.engine === undefined || e.engine === filter.engine) &&
    (filter.since === undefined || e.ts >= filter.since);
  const window = (lo: number, hi: number): JournalEvent[] =>
    mergeBySeq(
      (rowsIn.all({ ...params, lo, hi }) as EventRow[]).map(rowToEvent),
      packs.window({ lo, hi }, keep).map(rowToEvent),
      (e) => e.seq,
    );
  const head = db.prepare(HEAD_SEQ_SQL).pluck().get() as number;
  // With a time floor, no event before the first seq at or after it can pass: start there.
  const floor = Math.max(
    opts.afterSeq,
    filter.since === undefined
      ? 0
      : (db.prepare(SINCE_SEQ_SQL).pluck().get({ since: filter.since }) as number),
  );
  const found: JournalEvent[] = [];
  for (const w of seqWindows(floor, head, 4096, opts.newest)) {
    if (takeInto(found, window(w.lo, w.hi), opts.limit, opts.newest)) break;
  }
  return found;
}

/** The seq before the first event with a ts at or after `@since`, rows or packs (the head if none). */
const SINCE_SEQ_SQL = `SELECT min(
    coalesce((SELECT min(seq) FROM event_rows WHERE ts >= @since), ${Number.MAX_SAFE_INTEGER}),
    coalesce((SELECT min(first_seq) FROM room_packs
               WHERE first_ts >= @since - ${PACK_SPAN_MS} AND last_ts >= @since), ${Number.MAX_SAFE_INTEGER})
  ) - 1`;

/**
 * Per-minute counts of states entered (`JournalReader.perMinute`), rows and packs: the rows by
 * SQL through `events_ts`, the packs of the window (`room_packs_first_ts`) decoded here.
 */
export function perMinuteCounts(
  db: Database.Database,
  window: { since: number; until: number },
): MinuteCount[] {
  const q = perMinuteQuery(
    window,
    "json_extract(data, '$.reason')",
    `(${EVENT_SELECT} WHERE e.ts >= @since AND e.ts < @until)`,
  );
  const tally = minuteTally(db.prepare(q.sql).all(window, ...q.params) as MinuteRow[]);
  new PackDecoder(db).timeWindow(window, tally.add);
  return tally.counts();
}

/**
 * `tailInWindows`' filter from a tail's: types, engine and a time floor on the view's columns.
 * (Room and request filters are not here: those reads find their events without walking seqs.)
 */
function viewFilter(filter: TailFilter): ViewFilter {
  const where: string[] = [];
  const params: Record<string, string | number> = {};
  if (filter.type !== undefined) {
    const types = Array.isArray(filter.type) ? filter.type : [filter.type];
    where.push(`type IN (${types.map((_, i) => `@type${i}`).join(', ')})`);
    types.forEach((t, i) => {
      params[`type${i}`] = t;
    });
  }
  if (filter.engine !== undefined) {
    where.push('engine = @engine');
    params.engine = filter.engine;
  }
  if (filter.since !== undefined) {
    where.push('ts >= @since');
    params.since = filter.since;
  }
  return { where: where.join(' AND '), params };
}

/** The packed half of an engine's backlog since a seq (`engineBacklog` with a seq to start from). */
export const PACKED_BACKLOG = `SELECT * FROM (${PACKED_SELECT}
    WHERE p.last_seq > @afterSeq AND p.first_seq <= @headSeq
      AND (r.prefill_engine = @engine OR r.decode_engine = @engine))
  WHERE seq > @afterSeq AND seq <= @headSeq AND type IS NOT 'room.event_rejected'`;
