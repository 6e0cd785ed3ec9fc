/**
 * Packed rooms (schema 8, migrations/0008_room_packs.sql): the events of a room that ended long
 * enough ago, one row of `room_packs` per room instead of a row of `event_rows` per event and an
 * entry in each of its three indexes. The writer packs (`Packer`); the view `events` and the
 * readers here unpack.
 *
 * A pack spans at most PACK_SPAN_SEQS seqs and PACK_SPAN_MS of ts, so the packs holding any seq of
 * a window (lo, hi] are among those whose last seq is in (lo, hi + PACK_SPAN_SEQS] — one range of
 * `room_packs_last_seq` — and likewise for a window of time through `room_packs_first_ts`.
 */
import { EVENT_SELECT } from '../event-rows.ts';

export const PACK_SPAN_SEQS = 65_536;
export const PACK_SPAN_MS = 60_000;
/** Bytes of one event key in a pack: tag and 16 bytes (event-keys.ts, tags 00 and 01). */
export const KEY_BYTES = 17;

/** The columns of the `events` view, from `room_packs p`: filter on `p` before the expansion. */
export const PACKED_SELECT = `SELECT p.first_seq + json_extract(j.value, '$[0]') AS seq,
    p.first_ts + json_extract(j.value, '$[1]') AS ts, t.name AS type, r.room AS room,
    g.name AS engine, s.name AS source,
    CASE WHEN json_extract(j.value, '$[7]') IS NULL THEN substr(p.keys, ${KEY_BYTES} * j.key + 1, ${KEY_BYTES})
         ELSE CAST(x'02' || CAST(json_extract(j.value, '$[7]') AS BLOB) AS BLOB) END AS event_id,
    CASE WHEN json_extract(j.value, '$[5]') = 0 THEN json_extract(j.value, '$[6]')
         ELSE json_patch(json_extract(j.value, '$[6]'),
           (SELECT json FROM event_shared WHERE id = json_extract(j.value, '$[5]'))) END AS data
  FROM room_packs p
  JOIN rooms r ON r.id = p.room
  JOIN json_each(p.events) j
  LEFT JOIN event_names t ON t.id = json_extract(j.value, '$[2]')
  LEFT JOIN event_names g ON g.id = json_extract(j.value, '$[3]')
  LEFT JOIN event_names s ON s.id = json_extract(j.value, '$[4]')`;

/** The newest seq stored, in a row or a pack (0 when none). */
export const HEAD_SEQ_SQL = `SELECT max(coalesce((SELECT max(seq) FROM event_rows), 0),
  coalesce((SELECT max(last_seq) FROM room_packs), 0))`;

/** Events in a pack, from its keys (their length is the header's: no read of the pack). */
export const PACKED_EVENTS = `length(keys) / ${KEY_BYTES}`;

/**
 * Every event with `@lo < seq <= @hi`, rows and packs, in seq order, as the columns `columns` of
 * the view (`*` or a list), filtered further by `where` (on those columns) when given.
 */
export function windowSql(columns = '*', where = ''): string {
  return `SELECT ${columns} FROM (
      ${EVENT_SELECT} WHERE e.seq > @lo AND e.seq <= @hi
      UNION ALL
      SELECT * FROM (${PACKED_SELECT}
        WHERE p.last_seq > @lo AND p.last_seq <= @hi + ${PACK_SPAN_SEQS} AND p.first_seq <= @hi)
       WHERE seq > @lo AND seq <= @hi)
    ${where ? `WHERE ${where}` : ''} ORDER BY seq`;
}
