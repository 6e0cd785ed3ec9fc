/** SQL of packed rooms on PostgreSQL (migrations/postgres/0006_room_packs.sql). */
import { PACK_KEY_BYTES } from '../../packs.ts';

/** The columns of `events`, as `event_rows` holds them. */
export const COLUMNS = 'seq, ts, type, room, engine, source, event_id, data, term';

/** The newest seq stored, in a row or a pack (0 when none). */
export const HEAD_SEQ_SQL = `SELECT greatest(coalesce((SELECT max(seq) FROM event_rows), 0),
  coalesce((SELECT max(last_seq) FROM room_packs), 0)) AS head`;

/** Events in a pack, from its keys (no read of its JSON). */
export const PACKED_EVENTS = `length(keys) / ${PACK_KEY_BYTES}`;

/**
 * The creation time of the oldest room that still has rows (null: none): a whole run's start.
 * It reads `events_room_seq` from end to end, a few hundred milliseconds a million rows: once in
 * PACK_WHOLE_EVERY runs, and off the writing session.
 */
export const OLDEST_WITH_ROWS = `SELECT min(r.created_at) AS oldest
  FROM (SELECT DISTINCT room FROM event_rows WHERE room IS NOT NULL) e JOIN rooms r ON r.room = e.room`;
