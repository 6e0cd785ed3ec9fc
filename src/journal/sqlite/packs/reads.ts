/** Reads of events that packs may hold: in windows of seqs or of time, never an unpacking of every pack. */
import type Database from 'better-sqlite3';
import type { TailFilter } from '../../store.ts';
import { EVENT_SELECT } from '../event-rows.ts';
import { HEAD_SEQ_SQL, PACK_SPAN_MS, PACKED_SELECT, windowSql } from './sql.ts';

/**
 * Reads events after a seq in windows of seqs, so that a read from far back never unpacks more
 * than its window: `page(afterSeq, limit)` gives the next `limit` events (fewer at the head).
 * Where no pack holds a seq after `afterSeq` — every read of recent events — it reads the rows
 * alone, as before packs.
 */
export class WindowedRead<Row> {
  private readonly rowsOnly: Database.Statement;
  private readonly window: Database.Statement;
  private readonly packsAfter: Database.Statement;
  private readonly head: Database.Statement;

  /** `columns` of the view; `raw`: rows as arrays. */
  constructor(db: Database.Database, columns: string, raw = false) {
    const rowsOnly = db.prepare(
      `SELECT ${columns} FROM (${EVENT_SELECT} WHERE e.seq > ? ORDER BY e.seq LIMIT ?)`,
    );
    const window = db.prepare(windowSql(columns));
    this.rowsOnly = raw ? rowsOnly.raw() : rowsOnly;
    this.window = raw ? window.raw() : window;
    this.packsAfter = db.prepare('SELECT 1 FROM room_packs WHERE last_seq > ? LIMIT 1').pluck();
    this.head = db.prepare(HEAD_SEQ_SQL).pluck();
  }

  page(afterSeq: number, limit: number): Row[] {
    if (this.packsAfter.get(afterSeq) === undefined) {
      return this.rowsOnly.all(afterSeq, limit) as Row[];
    }
    const head = this.head.get() as number;
    const out: Row[] = [];
    // Windows about as wide as the page: a pack is unpacked once for each window it meets.
    const width = Math.max(limit * 2, 1024);
    for (let lo = afterSeq; lo < head; lo += width) {
      for (const row of this.window.all({ lo, hi: Math.min(lo + width, head) }) as Row[]) {
        out.push(row);
        if (out.length === limit) return out;
      }
    }
    return out;
  }
}

/** Whether the journal holds any pack: where it does not, every read goes to the rows as before. */
export function hasPacks(db: Database.Database): boolean {
  return db.prepare('SELECT 1 FROM room_packs LIMIT 1').pluck().get() !== undefined;
}

/** A filter on the view's columns, with its named parameters. */
export interface ViewFilter {
  where: string;
  params: Record<string, string | number>;
}

/**
 * The `limit` newest (or oldest after `afterSeq`) events that pass `filter`, rows and packs, in
 * windows of seqs that widen while they find little: a rare type walks the history a window at a
 * time, a common one stops in the first. In seq order.
 */
export function tailInWindows(
  db: Database.Database,
  filter: ViewFilter,
  opts: { afterSeq: number; limit: number; newest: boolean },
): Record<string, unknown>[] {
  const stmt = db.prepare(windowSql('*', filter.where));
  const head = db.prepare(HEAD_SEQ_SQL).pluck().get() as number;
  const since = filter.params.since;
  // With a time floor, no event before the first seq at or after it can pass: start there.
  const floor = Math.max(
    opts.afterSeq,
    typeof since === 'number' ? (db.prepare(SINCE_SEQ_SQL).pluck().get({ since }) as number) : 0,
  );
  const found: Record<string, unknown>[] = [];
  let width = 4096;
  if (opts.newest) {
    for (let hi = head; hi > floor && found.length < opts.limit; ) {
      const lo = Math.max(hi - width, floor);
      const rows = stmt.all({ ...filter.params, lo, hi }) as Record<string, unknown>[];
      found.unshift(...rows.slice(-(opts.limit - found.length)));
      hi = lo;
      width = Math.min(width * 2, 1 << 20);
    }
    return found;
  }
  for (let lo = floor; lo < head && found.length < opts.limit; ) {
    const hi = Math.min(lo + width, head);
    const rows = stmt.all({ ...filter.params, lo, hi }) as Record<string, unknown>[];
    found.push(...rows.slice(0, opts.limit - found.length));
    lo = hi;
    width = Math.min(width * 2, 1 << 20);
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
 * The events with `@since <= ts < @until`, rows and packs, as the view's columns: the rows through
 * `events_ts`, the packs through `room_packs_first_ts` (a pack spans at most PACK_SPAN_MS).
 */
export const TIME_WINDOW_SQL = `(
  ${EVENT_SELECT} WHERE e.ts >= @since AND e.ts < @until
  UNION ALL
  SELECT * FROM (${PACKED_SELECT}
    WHERE p.first_ts >= @since - ${PACK_SPAN_MS} AND p.first_ts < @until)
   WHERE ts >= @since AND ts < @until)`;

/**
 * `tailInWindows`' filter from a tail's: types, engine and a time floor on the view's columns.
 * (Room and request filters are not here: those reads find their events without walking seqs.)
 */
export function viewFilter(filter: TailFilter): ViewFilter {
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
