-- pdctl journal, PostgreSQL schema 7: a packed event's data without its key names, and packs
-- without a primary key. Schema 6's packs spelled out every key of every event's data
-- (`"promptTokens":`, `"checksum":`, … — a quarter of a pack's JSON) and kept a `first_seq`
-- primary key no read uses (a window of seqs finds packs by `room_packs_last_seq`, which holds
-- first_seq too). An event whose data is an object of keys in the order JSON.stringify writes them
-- now has a shape with a `layout`: the object's text with each top-level value as `%s` (a `%` of a
-- key as `%%`), and the pack holds the values alone, as a JSON array in the data's place; the view
-- puts them back with format(), the shared end after them as before. Events packed by schema 6
-- keep their shapes (no layout: the data whole) and read as they did. Nothing is rewritten.
-- checkpoints: kept (the view reads every event as before, column by column).

ALTER TABLE event_shapes ADD COLUMN layout TEXT;  -- NULL: the pack holds the data whole

ALTER TABLE room_packs DROP CONSTRAINT room_packs_pkey;

CREATE OR REPLACE VIEW events (seq, ts, type, room, engine, source, event_id, data, term) AS
  SELECT seq, ts, type, room, engine, source, event_id, data, term FROM event_rows
  UNION ALL
  SELECT p.first_seq + (j.e ->> 0)::bigint, p.first_ts + (j.e ->> 1)::bigint,
         h.type, p.room, h.engine, h.source,
         CASE h.key_tag WHEN 2 THEN '\x02'::bytea || convert_to(j.e ->> 4, 'UTF8')
              ELSE (CASE h.key_tag WHEN 1 THEN '\x01'::bytea ELSE '\x00'::bytea END)
                   || substring(p.keys FROM 16 * (j.n - 1)::integer + 1 FOR 16) END,
         CASE WHEN h.suffix IS NULL THEN d.head ELSE left(d.head, -x.depth) || x.text END,
         h.term
    FROM room_packs p
    CROSS JOIN LATERAL json_array_elements(p.events) WITH ORDINALITY AS j (e, n)
    LEFT JOIN event_shapes h ON h.id = (j.e ->> 2)::integer
    LEFT JOIN event_suffixes x ON x.id = h.suffix
    CROSS JOIN LATERAL (
      SELECT CASE WHEN h.layout IS NULL THEN (j.e -> 3)::text
                  ELSE format(h.layout, VARIADIC ARRAY(
                    SELECT v.v::text FROM json_array_elements(j.e -> 3) WITH ORDINALITY AS v (v, n)
                     ORDER BY v.n)) END AS head) d;
