/**
 * Time-ordered identifiers. Event ids and room ids are keys of B-tree indexes that every append
 * writes; ids that grow with time land on the right edge of the tree, while random UUIDs touch a
 * random page per insert, which costs more as the index outgrows the cache (bench/journal.ts
 * prints the bare-loop figure for both).
 */
import { randomFillSync } from 'node:crypto';

/** Random bytes drawn in bulk: one syscall per 512 ids instead of one per id. */
const pool = Buffer.alloc(4096);
let poolOffset = pool.length;

let lastMs = 0;
let counter = 0;

/** A UUIDv7 (RFC 9562): 48-bit unix ms, then a 12-bit counter for order within one ms, then random bits. */
export function uuidv7(now: number = Date.now()): string {
  if (now > lastMs) {
    lastMs = now;
    counter = 0;
  } else {
    counter++;
    if (counter > 0xfff) {
      lastMs++;
      counter = 0;
    }
  }
  const ms = lastMs.toString(16).padStart(12, '0');
  if (poolOffset + 8 > pool.length) {
    randomFillSync(pool);
    poolOffset = 0;
  }
  pool[poolOffset] = ((pool[poolOffset] as number) & 0x3f) | 0x80;
  const tail = pool.toString('hex', poolOffset, poolOffset + 8);
  poolOffset += 8;
  return `${ms.slice(0, 8)}-${ms.slice(8, 12)}-7${counter.toString(16).padStart(3, '0')}-${tail.slice(0, 4)}-${tail.slice(4, 16)}`;
}

let roomCounter = 0;

/** A short, sortable room id such as `r-mf3k2a9x-0001c4`: base-36 ms, then a per-process counter. */
export function newRoomId(now: number = Date.now()): string {
  roomCounter = (roomCounter + 1) % 0x1000000;
  return `r-${now.toString(36)}-${roomCounter.toString(16).padStart(6, '0')}`;
}

/**
 * The room id in what a client has: the completion's `id` (`cmpl-<room>`, `chatcmpl-<room>`) names
 * its room, so it is taken wherever a room id is. Anything else is returned as it is.
 */
export function roomIdOf(id: string): string {
  const m = /^(?:chat)?cmpl-(r-.+)$/.exec(id);
  return m ? (m[1] as string) : id;
}

/** An `x-request-id` as pdctl takes it: printable ASCII, no spaces, at most 128 characters. */
const REQUEST_ID = /^[\x21-\x7e]{1,128}$/;

/** Whether a client's `x-request-id` is kept as it is (otherwise the API makes one). */
export function isRequestId(value: string): boolean {
  return REQUEST_ID.test(value);
}
