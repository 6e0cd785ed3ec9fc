import { PACK_KEY_BYTES } from '../../packs.ts';

/** The columns of the `events` view, from `room_packs p`: filter on `p` before the expansion. */
export const PACKED_SELECT = `SELECT p.first_seq + json_extract(j.value, '$[0]') AS seq,
    p.first_ts + json_extract(j.value, '$[1]') AS ts, t.name AS type, r.room AS room,
    g.name AS engine, s.name AS source,
    CASE h.key_tag
      WHEN 2 THEN CAST(x'02' || CAST(json_extract(j.value, '$[4]') AS BLOB) AS BLOB)
      ELSE CAST((CASE h.key_tag WHEN 1 THEN x'01' ELSE x'00' END)
                || substr(p.keys, ${PACK_KEY_BYTES} * j.key + 1, ${PACK_KEY_BYTES}) AS BLOB) END AS event_id,
    CASE WHEN h.shared = 0 THEN json_extract(j.value, '$[3]')
         ELSE json_patch(json_extract(j.value, '$[3]'),
           (SELECT json FROM event_shared WHERE id = h.shared)) END AS data
  FROM room_packs p
  JOIN rooms r ON r.id = p.room
  JOIN json_each(p.events) j
  LEFT JOIN event_shapes h ON h.id = json_extract(j.value, '$[2]')
  LEFT JOIN event_names t ON t.id = h.type
  LEFT JOIN event_names g ON g.id = h.engine
  LEFT JOIN event_names s ON s.id = h.source`;

/** The newest seq stored, in a row or a pack (0 when none). */
export const HEAD_SEQ_SQL = `SELECT max(coalesce((SELECT max(seq) FROM event_rows), 0),
  coalesce((SELECT max(last_seq) FROM room_packs), 0))`;

/** Events in a pack, from its keys (their length is the header's: no read of the pack). */
export const PACKED_EVENTS = `length(keys) / ${PACK_KEY_BYTES}`;
