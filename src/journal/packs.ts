import { type Clock, systemClock, type Timer } from '../ports/clock.ts';
import { CREATED_REPEATED_KEYS } from '../room/events.ts';

/**
 * What both backends' packs of rooms share (docs/journal.md, "Packed rooms"): how far one pack may
 * span, how a room's events split into packs, and which event keys a pack holds in its `keys`.
 */

/** A pack spans fewer seqs than this, so a window of seqs finds its packs by their last seq. */
export const PACK_SPAN_SEQS = 65_536;
/** A pack spans at most this long, so a window of time finds its packs by their first ts. */
export const PACK_SPAN_MS = 60_000;
/** Bytes of a stored event key: a tag and 16 bytes (event-keys.ts, tags 00, 01). */
export const KEY_BYTES = 17;
/** Bytes of an event's key in a pack's `keys`: its 16 bytes (the tag is its shape's). */
export const PACK_KEY_BYTES = 16;
/** The tag of an event id that is text (event-keys.ts): a pack holds the text in the event. */
export const TEXT_TAG = 2;
/** A key's place in `keys` for an event whose id is text. */
export const NO_KEY = Buffer.alloc(PACK_KEY_BYTES);

/** One pack of a room's events, as a packer builds it. */
export interface Pack<R> {
  firstSeq: number;
  lastSeq: number;
  firstTs: number;
  lastTs: number;
  rows: R[];
}

/** A room's events, in seq order, as packs within the spans. */
export function packsOf<R extends { seq: number; ts: number }>(rows: R[]): Pack<R>[] {
  const packs: Pack<R>[] = [];
  let cur: Pack<R> | null = null;
  for (const r of rows) {
    if (
      cur &&
      r.seq - cur.firstSeq < PACK_SPAN_SEQS &&
      Math.max(cur.lastTs, r.ts) - Math.min(cur.firstTs, r.ts) <= PACK_SPAN_MS
    ) {
      cur.rows.push(r);
      cur.lastSeq = r.seq;
      cur.firstTs = Math.min(cur.firstTs, r.ts);
      cur.lastTs = Math.max(cur.lastTs, r.ts);
    } else {
      cur = { firstSeq: r.seq, lastSeq: r.seq, firstTs: r.ts, lastTs: r.ts, rows: [r] };
      packs.push(cur);
    }
  }
  return packs;
}

/**
 * Whether a pack can hold this stored key: 16 bytes after a tag of 00 or 01, or an id that is
 * text (tag 02, of any length) whose bytes are UTF-8 through and through.
 */
export function keyFits(key: Buffer): boolean {
  if (key[0] !== TEXT_TAG) return key.length === KEY_BYTES && (key[0] === 0 || key[0] === 1);
  return Buffer.from(key.toString('utf8', 1), 'utf8').equals(key.subarray(1));
}

/** The pack's `keys`: each event's 16 bytes, zeros for an id that is text. */
export function packKeys(keys: Buffer[]): Buffer {
  return Buffer.concat(keys.map((k) => (k[0] === TEXT_TAG ? NO_KEY : k.subarray(1))));
}

/** A pack's event, as its JSON array holds it: `[dseq, dts, shape, data(, text id)]`. */
export function packedEvent(
  pack: { firstSeq: number; firstTs: number },
  row: { seq: number; ts: number; event_id: Buffer; data: string },
  shape: number,
): string {
  const text =
    row.event_id[0] === TEXT_TAG ? `,${JSON.stringify(row.event_id.toString('utf8', 1))}` : '';
  return `[${row.seq - pack.firstSeq},${row.ts - pack.firstTs},${shape},${row.data}${text}]`;
}

/** Keys of the object at `parent` (a path from the data's top), in the order they are shared. */
export interface SharedKeys {
  parent: readonly string[];
  keys: readonly string[];
}

/**
 * The keys of an event's data that repeat across rooms, by type, in document order: a journal may
 * keep them once (SQLite's `event_shared`, PostgreSQL's `event_suffixes`). Migration 0007 split the
 * first ones (a room.created's reservation identity and deadline table, a room.bootstrapped's pool
 * and epoch); since then the writer also splits a room.created's engines, model and transport
 * (written last for it: CREATED_REPEATED_KEYS), a transfer's transport and a completion's finish
 * reason.
 */
export const SHARED_KEYS: Readonly<Record<string, readonly SharedKeys[]>> = {
  'room.created': [
    { parent: ['reservation', 'decode'], keys: ['pool', 'epoch', 'incarnation'] },
    { parent: [], keys: CREATED_REPEATED_KEYS },
  ],
  'room.bootstrapped': [{ parent: [], keys: ['pool', 'epoch'] }],
  'room.transfer_completed': [{ parent: [], keys: ['transport'] }],
  'room.completed': [{ parent: [], keys: ['finishReason'] }],
};

export type Json = Record<string, unknown>;
export const isObject = (v: unknown): v is Json =>
  typeof v === 'object' && v !== null && !Array.isArray(v);

/** JSON text's object, or null where the text is not JSON or not an object. */
export function parseObject(text: string): Json | null {
  try {
    const data: unknown = JSON.parse(text);
    return isObject(data) ? data : null;
  } catch {
    return null;
  }
}

/**
 * A copy of `obj` whose object at `parent` lacks `keys` (the rest shares what it can with `obj`).
 * Built key by key rather than by `delete`, which would leave V8 a slow object to serialize.
 */
export function without(obj: Json, parent: readonly string[], keys: readonly string[]): Json {
  const out: Json = {};
  for (const k of Object.keys(obj)) {
    if (parent.length === 0) {
      if (!keys.includes(k)) out[k] = obj[k];
    } else {
      out[k] = k === parent[0] ? without(obj[k] as Json, parent.slice(1), keys) : obj[k];
    }
  }
  return out;
}

/**
 * An event's data text split where what rooms repeat begins: `suffix`, the text from the comma
 * before the first shared key on, and `head`, the JSON of the rest — the text before that comma
 * and `depth` closing braces (those of the objects the suffix is inside) — so that `head`
 * without its last `depth` characters, then `suffix`, is the text itself. It splits where every
 * key after that comma, at any depth, is a shared key (SHARED_KEYS): checked by writing the rest
 * as JSON, which must be `head` exactly. Null where no such place is found.
 */
export function sharedSuffix(
  type: string,
  text: string,
): { head: string; suffix: string; depth: number } | null {
  const groups = SHARED_KEYS[type];
  if (groups === undefined) return null;
  const data = parseObject(text);
  if (data === null) return null;
  // Each group that has a key here, where its first key is in the text.
  const found: Array<{ group: SharedKeys; keys: string[]; at: number }> = [];
  for (const group of groups) {
    let at: unknown = data;
    for (const step of group.parent) at = isObject(at) ? at[step] : undefined;
    if (!isObject(at)) continue;
    const obj = at;
    const keys = group.keys.filter((k) => obj[k] !== undefined);
    if (keys.length === 0) continue;
    found.push({ group, keys, at: text.lastIndexOf(`,${JSON.stringify(keys[0])}:`) });
  }
  // From the earliest place on: the split there takes that group and every later one.
  const order = found.filter((f) => f.at > 0).sort((a, b) => a.at - b.at);
  for (const [i, start] of order.entries()) {
    let rest: Json = data;
    for (const f of order.slice(i)) rest = without(rest, f.group.parent, f.keys);
    const depth = start.group.parent.length + 1;
    const head = `${text.slice(0, start.at)}${'}'.repeat(depth)}`;
    if (Object.keys(rest).length > 0 && JSON.stringify(rest) === head) {
      return { head, suffix: text.slice(start.at), depth };
    }
  }
  return null;
}

/**
 * The windows of seqs a read walks between `floor` and `head` (`lo < seq <= hi`), from the oldest
 * or, `newest`, from the head down: as wide as `width` at first and twice as wide after each, up to
 * a pack's span, so that a read that finds little soon takes big steps. The reader stops when it
 * has enough (`takeInto`).
 */
export function* seqWindows(
  floor: number,
  head: number,
  width: number,
  newest: boolean,
): Generator<{ lo: number; hi: number }> {
  for (let lo = floor, hi = head; newest ? hi > floor : lo < head; ) {
    if (newest) lo = Math.max(hi - width, floor);
    else hi = Math.min(lo + width, head);
    yield { lo, hi };
    if (newest) hi = lo;
    else lo = hi;
    width = Math.min(width * 2, PACK_SPAN_SEQS);
  }
}

/**
 * A window's events added to what a read found, up to `limit`: the first of them, or, `newest`,
 * the last, before what it found. Returns whether it has found enough.
 */
export function takeInto<T>(found: T[], more: T[], limit: number, newest: boolean): boolean {
  const room = limit - found.length;
  if (room > 0) {
    if (newest) found.unshift(...more.slice(Math.max(more.length - room, 0)));
    else found.push(...more.slice(0, room));
  }
  return found.length >= limit;
}

/** Two lists in seq order as one. */
export function mergeBySeq<T>(a: T[], b: T[], seq: (x: T) => number): T[] {
  if (b.length === 0) return a;
  if (a.length === 0) return b;
  const out: T[] = [];
  let i = 0;
  let j = 0;
  while (i < a.length || j < b.length) {
    if (j === b.length || (i < a.length && seq(a[i] as T) < seq(b[j] as T))) out.push(a[i++] as T);
    else out.push(b[j++] as T);
  }
  return out;
}

/** What a packing run did: rooms packed, their events, rooms left as rows. */
export interface PackTotals {
  rooms: number;
  events: number;
  skipped: number;
}

/**
 * Rooms are packed 5 minutes after they end: their engines' releases are in by then (the same
 * floor as retention's), and a retried append of one of their events is still found a duplicate
 * until then (a packed event's id is no longer looked up: a retry is refused as late).
 */
export const PACK_AFTER_MS = 5 * 60_000;
/** Rooms packed in one transaction: a few milliseconds of the writer. */
export const PACK_ROOMS_PER_PASS = 16;
/** How often packing looks for rooms to pack while a journal is open. */
export const PACK_EVERY_MS = 5_000;
/** One run in this many is whole (each backend's packer says what that walks): every 5 minutes. */
export const PACK_WHOLE_EVERY = 60;

/**
 * Runs `pack` every `everyMs` while `ready()`, packing the rooms that ended `afterMs` ago: quick
 * runs, and a whole one at first and every PACK_WHOLE_EVERY runs after; a failure is logged once
 * per spell of failures. Returns the timer (unref'd) to clear on close.
 */
export function packEvery(o: {
  /** Its timer and its horizon's now. Default: the process's clock. */
  clock?: Clock;
  afterMs: number;
  everyMs: number;
  ready: () => boolean;
  pack: (cutoffTs: number, quick: boolean) => Promise<PackTotals>;
  log: {
    info(o: object, msg: string): void;
    debug(o: object, msg: string): void;
    warn(o: object, msg: string): void;
  };
}): Timer {
  const clock = o.clock ?? systemClock;
  let runs = 0;
  let failing = false;
  let running = false;
  const timer = clock.setInterval(() => {
    if (running || !o.ready()) return;
    running = true;
    const quick = runs++ % PACK_WHOLE_EVERY !== 0;
    o.pack(clock.now() - o.afterMs, quick)
      .then(
        (t) => {
          if (failing) o.log.info({ afterMs: o.afterMs }, 'journal packing works again');
          failing = false;
          if (t.rooms > 0 || t.skipped > 0) {
            o.log.debug({ ...t, afterMs: o.afterMs }, 'journal packed rooms that ended');
          }
        },
        (err: unknown) => {
          // Once per spell of failures (a full disk fails every run until it has room again).
          if (!failing) o.log.warn({ err }, 'journal packing failed; it is tried every 5 s');
          failing = true;
        },
      )
      .finally(() => {
        running = false;
      });
  }, o.everyMs);
  timer.unref();
  return timer;
}
