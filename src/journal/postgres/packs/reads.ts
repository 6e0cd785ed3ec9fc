/**
 * Reads of events that packs may hold (PostgreSQL schemas 6 and 7): in windows of seqs or of time, the
 * packs fetched as they are stored and decoded here — a tenth of the time PostgreSQL's JSON
 * functions take to expand them — and never an unpacking of every pack (the view's packed half
 * has no index on the seq it computes).
 */
import {
  mergeBySeq,
  PACK_KEY_BYTES,
  PACK_SPAN_MS,
  PACK_SPAN_SEQS,
  seqWindows,
  TEXT_TAG,
  takeInto,
} from '../../packs.ts';
import type { EventRow } from '../../rows.ts';
import { keysOf, objectOf } from './layout.ts';
import { COLUMNS, HEAD_SEQ_SQL } from './sql.ts';

/** Runs SQL with `?` placeholders (a pool's query, or one snapshot's); its rows as objects. */
export type Run = (sql: string, params: unknown[]) => Promise<Array<Record<string, unknown>>>;

/** An event as `events` gives it: its row, and the leader's term that wrote it. */
export type TermRow = EventRow & { term: number };

/** A test of a decoded event of a pack, before it is written out. */
export type Keep = (
  row: Omit<TermRow, 'data' | 'event_id'>,
  data: Record<string, unknown>,
) => boolean;

/**
 * A test of an event's shape (its type and engine) that `Keep` implies: packs holding no event of
 * a shape it passes are left in the database (a pattern on their text), not decoded here.
 */
export type ShapeTest = (shape: { type: string; engine: string | null }) => boolean;

/** A row of `event_shapes`. */
interface Shape {
  type: string;
  engine: string | null;
  source: string;
  key_tag: number;
  term: number;
  suffix: number | null;
  /** The keys of its layout (layout.ts), or null: the pack holds the data whole. */
  keys: string[] | null;
}

/** A pack as it is read. */
interface PackRow {
  first_seq: number;
  last_seq: number;
  first_ts: number;
  room: string;
  events: string;
  keys: Buffer;
}

/** One event of a pack, as its JSON array holds it (packer.ts): its data, or the values of its shape's layout. */
type PackedEvent = [dseq: number, dts: number, shape: number, data: unknown, textId?: string];

const PACK_COLUMNS = 'p.first_seq, p.last_seq, p.first_ts, p.room, p.events::text AS events';

/**
 * Packs decoded into the view's rows: the same columns and values as its packed half, the data
 * with its shared end put back (the view's text, parsed and written again: the same JSON). An
 * event whose shape names nothing is left out (the view's LEFT JOIN gives it no type).
 */
export class PackDecoder {
  private shapes = new Map<number, Shape>();
  private suffixes = new Map<number, { depth: number; text: string }>();

  /** `ids: false`: events without their ids (`event_id` empty), for a read that needs none (verify). */
  constructor(
    private readonly run: Run,
    private readonly o: { ids?: boolean } = {},
  ) {}

  /** A pack's columns as it reads them: its keys only where events keep their ids. */
  private get columns(): string {
    return `${PACK_COLUMNS}, ${this.o.ids === false ? "''::bytea AS keys" : 'p.keys'}`;
  }

  /**
   * The packed events with `lo < seq <= hi`, in seq order; `engine`: of its rooms only; `shapes`:
   * only packs with an event of a shape it passes are read.
   */
  async window(
    w: { lo: number; hi: number },
    keep?: Keep,
    o: { engine?: string; shapes?: ShapeTest } = {},
  ): Promise<TermRow[]> {
    const where = ['p.last_seq > ? AND p.last_seq <= ? AND p.first_seq <= ?'];
    const params: unknown[] = [w.lo, w.hi + PACK_SPAN_SEQS, w.hi];
    if (o.engine !== undefined) {
      where.push('(r.prefill_engine = ? OR r.decode_engine = ?)');
      params.push(o.engine, o.engine);
    }
    const test = o.shapes;
    if (test !== undefined) {
      await this.readShapes();
      const ids = [...this.shapes].filter(([, h]) => test(h)).map(([id]) => id);
      if (ids.length === 0) return [];
      // An event's shape is the third number of its array (a data's array may match too: the
      // test after decoding leaves those out).
      where.push('p.events::text ~ ?');
      params.push(`\\[-?\\d+,-?\\d+,(?:${ids.join('|')}),`);
    }
    const packs = (await this.run(
      `SELECT ${this.columns} FROM room_packs p${o.engine === undefined ? '' : ' JOIN rooms r ON r.room = p.room'}
        WHERE ${where.join(' AND ')}`,
      params,
    )) as unknown as PackRow[];
    return this.decode(packs, (e) => e.seq > w.lo && e.seq <= w.hi, keep);
  }

  /** The packed events with `since <= ts < until`, in seq order. */
  async timeWindow(w: { since: number; until: number }, keep?: Keep): Promise<TermRow[]> {
    const packs = (await this.run(
      `SELECT ${this.columns} FROM room_packs p WHERE p.first_ts >= ? AND p.first_ts < ?`,
      [w.since - PACK_SPAN_MS, w.until],
    )) as unknown as PackRow[];
    return this.decode(packs, (e) => e.ts >= w.since && e.ts < w.until, keep);
  }

  private async decode(packs: PackRow[], inWindow: Keep, keep?: Keep): Promise<TermRow[]> {
    const parsed = packs.map((p) => JSON.parse(p.events) as PackedEvent[]);
    // Shapes and shared ends new to this decoder, read before the events are (a few rows).
    if (parsed.some((events) => events.some((e) => !this.shapes.has(e[2])))) {
      await this.readShapes();
    }
    const out: TermRow[] = [];
    for (let i = 0; i < packs.length; i++) {
      const p = packs[i] as PackRow;
      const events = parsed[i] as PackedEvent[];
      for (let k = 0; k < events.length; k++) {
        const [dseq, dts, shapeId, stored, textId] = events[k] as PackedEvent;
        const shape = this.shapes.get(shapeId);
        if (shape === undefined) continue;
        const row = {
          seq: p.first_seq + dseq,
          ts: p.first_ts + dts,
          type: shape.type,
          room: p.room,
          engine: shape.engine,
          source: shape.source,
          term: shape.term,
          event_id: EMPTY,
          data: '',
        };
        const data =
          shape.keys === null
            ? (stored as Record<string, unknown>)
            : objectOf(shape.keys, stored as unknown[]);
        if (!inWindow(row, data) || (keep && !keep(row, data))) continue;
        if (this.o.ids === false) {
          // left empty
        } else if (shape.key_tag === TEXT_TAG) {
          row.event_id = Buffer.concat([TEXT_PREFIX, Buffer.from(String(textId), 'utf8')]);
        } else {
          const key = Buffer.allocUnsafe(PACK_KEY_BYTES + 1);
          key[0] = shape.key_tag;
          p.keys.copy(key, 1, PACK_KEY_BYTES * k, PACK_KEY_BYTES * (k + 1));
          row.event_id = key;
        }
        // The view's text: the stored data without its last `depth` braces, then the shared end.
        const end = shape.suffix === null ? undefined : this.suffixes.get(shape.suffix);
        const text = JSON.stringify(data);
        row.data = end === undefined ? text : text.slice(0, -end.depth) + end.text;
        out.push(row);
      }
    }
    return out.sort((a, b) => a.seq - b.seq);
  }

  /** Reads the shapes and shared ends it lacks (both tables only grow while it reads). */
  private async readShapes(): Promise<void> {
    const shapes = (await this.run(
      'SELECT id, type, engine, source, key_tag, term, suffix, layout FROM event_shapes WHERE id > ?',
      [Math.max(0, ...this.shapes.keys())],
    )) as unknown as Array<Omit<Shape, 'keys'> & { id: number; layout: string | null }>;
    for (const { layout, ...r } of shapes) {
      this.shapes.set(r.id, { ...r, keys: layout === null ? null : keysOf(layout) });
    }
    const ends = await this.run('SELECT id, depth, text FROM event_suffixes WHERE id > ?', [
      Math.max(0, ...this.suffixes.keys()),
    ]);
    for (const r of ends) {
      this.suffixes.set(Number(r.id), { depth: Number(r.depth), text: String(r.text) });
    }
  }
}

const EMPTY = Buffer.alloc(0);
const TEXT_PREFIX = Buffer.of(TEXT_TAG);

/**
 * The `limit` events after `afterSeq` (the last `limit`, with `newest`) that pass a filter —
 * `where` in SQL on the rows' columns with its `?` parameters, `keep` on packs' decoded events,
 * the same test — in seq order. Where no pack holds a seq after `afterSeq`, or (newest first)
 * every pack is older than what the rows gave, it reads the rows alone, as before packs;
 * otherwise windows of seqs that widen while they find little: a rare type walks the history a
 * window at a time, a common one stops in the first.
 */
export async function eventsInWindows(
  run: Run,
  packs: PackDecoder,
  o: {
    afterSeq: number;
    limit: number;
    newest: boolean;
    where?: string;
    params?: unknown[];
    keep?: Keep;
    shapes?: ShapeTest;
    /** false: rows without their ids (`event_id` empty; the decoder's `ids` should agree). */
    ids?: boolean;
  },
): Promise<TermRow[]> {
  const columns =
    o.ids === false ? `${COLUMNS.replace('event_id, ', '')}, ''::bytea AS event_id` : COLUMNS;
  const filter = o.where ? ` AND ${o.where}` : '';
  const params = o.params ?? [];
  const [p] = await run('SELECT max(last_seq) AS last FROM room_packs', []);
  const packsEnd = Number(p?.last ?? 0);
  if (packsEnd <= o.afterSeq || o.newest) {
    const rows = (await run(
      `SELECT ${columns} FROM event_rows WHERE seq > ?${filter}
        ORDER BY seq ${o.newest ? 'DESC' : 'ASC'} LIMIT ?`,
      [o.afterSeq, ...params, o.limit],
    )) as unknown as TermRow[];
    const last = rows[rows.length - 1];
    const complete = rows.length === o.limit && last !== undefined && last.seq > packsEnd;
    if (packsEnd <= o.afterSeq || complete) return o.newest ? rows.reverse() : rows;
  }
  const [h] = await run(HEAD_SEQ_SQL, []);
  const head = Number(h?.head ?? 0);
  const window = async (lo: number, hi: number): Promise<TermRow[]> =>
    mergeBySeq(
      (await run(
        `SELECT ${columns} FROM event_rows WHERE seq > ? AND seq <= ?${filter} ORDER BY seq`,
        [lo, hi, ...params],
      )) as unknown as TermRow[],
      await packs.window({ lo, hi }, o.keep, { shapes: o.shapes }),
      (e) => e.seq,
    );
  const found: TermRow[] = [];
  // Windows start about as wide as the page and double while they find little.
  for (const w of seqWindows(o.afterSeq, head, Math.max(o.limit * 2, 512), o.newest)) {
    if (takeInto(found, await window(w.lo, w.hi), o.limit, o.newest)) break;
  }
  return found;
}
