/**
 * Ids made by the process's id source (ports/ids.ts). A part that a simulated run uses takes an
 * `Ids` of its own instead, so that its ids follow from the run's seed.
 */
import { systemIds } from '../ports/ids.ts';

/** What a room or engine id may be: what the CLI, the API, the bus and the transfer core accept. */
export const ID_PATTERN = '^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$';
const idRe = new RegExp(ID_PATTERN);

/** Whether a string can be a room or engine id. */
export function isValidId(value: string): boolean {
  return idRe.test(value);
}

/** A UUIDv7 (RFC 9562): 48-bit unix ms, then a 12-bit counter for order within one ms, then random bits. */
export function uuidv7(now?: number): string {
  return systemIds.uuid(now);
}

/** A short, sortable room id such as `r-mf3k2a9x-0001c4`: base-36 ms, then a per-process counter. */
export function newRoomId(now?: number): string {
  return systemIds.room(now);
}

/** When a room id of `newRoomId`'s form was made (unix ms), or null for an id of another form. */
export function roomIdTime(id: string): number | null {
  const m = /^r-([0-9a-z]{7,9})-[0-9a-f]{6}$/.exec(id);
  if (!m) return null;
  const ms = Number.parseInt(m[1] as string, 36);
  // 2001 to 2286: what base-36 ms of 8 digits spans, and no other id looks like one.
  return ms >= 1e12 && ms < 1e13 ? ms : null;
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
