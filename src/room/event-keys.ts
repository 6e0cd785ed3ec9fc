/**
 * How an event id is stored (SQLite schema 5, PostgreSQL schema 4): as a short binary key rather
 * than the text, since the id is kept twice — in the row and in the unique index that makes a
 * retried append a duplicate. A tag byte says how to read the rest:
 *
 *   0x00 + 16 bytes   a UUID (`01a23fd8-2e22-7000-9901-83b1267ddc83`): the control plane's ids
 *   0x01 + 16 bytes   `<source>/<UUID>`: an engine's id in its namespace (`engine:decode-0/…`,
 *                     docs/protocol.md), the prefix being the row's `source`
 *   0x02 + UTF-8      any other id, as it is (`r-mx8mt0ki-000002:aborted`)
 *
 * 17 bytes instead of 36–52 characters, in the row and again in the index (measured in
 * docs/journal.md, _What a room takes_). The key of an engine's id leaves its namespace out, so
 * the same UUID under two namespaces is one key: the second is refused `event_id_conflict`
 * (a different event under a taken id), never stored twice and never taken as a duplicate.
 */

const TAG_UUID = 0;
const TAG_NAMESPACED = 1;
const TAG_TEXT = 2;

/** A lower-case hex digit's value, or -1. */
function nibble(code: number): number {
  if (code >= 48 && code <= 57) return code - 48; // 0-9
  if (code >= 97 && code <= 102) return code - 87; // a-f
  return -1;
}

/**
 * The key of the canonical UUID at `id[from..from+36)`, or null when it is not one (upper-case
 * digits included: they would not read back the same). One pass by hand, on every append: a
 * regular expression and Buffer's hex codec took four times as long.
 */
function uuidKey(tag: number, id: string, from: number): Buffer | null {
  const key = Buffer.allocUnsafe(17);
  key[0] = tag;
  let byte = 1;
  let i = from;
  const end = from + 36;
  while (i < end) {
    const at = i - from;
    if (at === 8 || at === 13 || at === 18 || at === 23) {
      if (id.charCodeAt(i++) !== 45) return null; // '-'
      continue;
    }
    const hi = nibble(id.charCodeAt(i));
    const lo = nibble(id.charCodeAt(i + 1));
    if (hi < 0 || lo < 0) return null;
    key[byte++] = (hi << 4) | lo;
    i += 2;
  }
  return key;
}

// Buffer's hex codec is the fast way out (measured: a quarter of a loop by hand), though not in.
function uuidText(k: Buffer): string {
  const h = k.toString('hex', 1, 17);
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/** The stored key of `eventId`, appended by `source`. */
export function eventKey(eventId: string, source: string): Buffer {
  const n = source.length;
  const key =
    eventId.length === 36
      ? uuidKey(TAG_UUID, eventId, 0)
      : eventId.length === n + 37 && eventId.charCodeAt(n) === 47 && eventId.startsWith(source)
        ? uuidKey(TAG_NAMESPACED, eventId, n + 1)
        : null;
  if (key) return key;
  return Buffer.concat([Buffer.of(TAG_TEXT), Buffer.from(eventId, 'utf8')]);
}

/** The event id a stored key stands for, in a row whose `source` is `source`. */
export function eventIdOf(b: Buffer, source: string): string {
  switch (b[0]) {
    case TAG_UUID:
      if (b.length === 17) return uuidText(b);
      break;
    case TAG_NAMESPACED:
      if (b.length === 17) return `${source}/${uuidText(b)}`;
      break;
    case TAG_TEXT:
      return b.toString('utf8', 1);
  }
  throw new Error(`stored event key ${b.toString('hex')} is not one pdctl writes (tag ${b[0]})`);
}
