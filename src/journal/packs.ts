import { CREATED_REPEATED_KEYS } from './events.ts';

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

/**
 * Keys at the top of an event's data that repeat across rooms, by type, written last in this
 * order (commit-queue.ts puts a room.created's there): a journal may keep them once.
 */
export const TRAILING_SHARED_KEYS: Readonly<Record<string, readonly string[]>> = {
  'room.created': CREATED_REPEATED_KEYS,
  'room.bootstrapped': ['pool', 'epoch'],
  'room.transfer_completed': ['transport'],
  'room.completed': ['finishReason'],
};

/**
 * An event's data text split before its trailing shared keys: `head`, the JSON of the rest, and
 * `suffix`, the text from the comma before the first of them to the end, so that `head` without
 * its closing brace, then `suffix`, is the text itself. Null where its type shares none, none are
 * there, they are not its last keys, or nothing would be left.
 */
export function sharedSuffix(type: string, text: string): { head: string; suffix: string } | null {
  const keys = TRAILING_SHARED_KEYS[type];
  if (keys === undefined) return null;
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof data !== 'object' || data === null || Array.isArray(data)) return null;
  const all = Object.keys(data);
  const has = keys.filter((k) => k in data);
  if (has.length === 0 || has.length === all.length) return null;
  if (all.slice(-has.length).some((k, i) => k !== has[i])) return null;
  const at = text.lastIndexOf(`,${JSON.stringify(has[0])}:`);
  if (at < 0) return null;
  const head = `${text.slice(0, at)}}`;
  // Found inside a value rather than at the top: the head is no object of the other keys.
  try {
    const rest = JSON.parse(head) as unknown;
    if (typeof rest !== 'object' || rest === null || Array.isArray(rest)) return null;
    if (Object.keys(rest).length !== all.length - has.length) return null;
  } catch {
    return null;
  }
  return { head, suffix: text.slice(at) };
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
  afterMs: number;
  everyMs: number;
  ready: () => boolean;
  pack: (cutoffTs: number, quick: boolean) => Promise<PackTotals>;
  log: {
    info(o: object, msg: string): void;
    debug(o: object, msg: string): void;
    warn(o: object, msg: string): void;
  };
}): NodeJS.Timeout {
  let runs = 0;
  let failing = false;
  let running = false;
  const timer = setInterval(() => {
    if (running || !o.ready()) return;
    running = true;
    const quick = runs++ % PACK_WHOLE_EVERY !== 0;
    o.pack(Date.now() - o.afterMs, quick)
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
