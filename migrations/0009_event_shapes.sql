-- pdctl journal, schema 9: a packed event names its shape once.
-- Every packed event spelled out its type, engine, source and shared part as four ids (about 8 of
-- its ~52 bytes a room event), and its key's tag byte: the same ten combinations in every room.
-- `event_shapes` now holds each combination once, with the tag of the event's id (0 or 1: its 16
-- bytes are in the pack's `keys`; 2: the id is text, in the event), and a pack's `events` is a
-- JSON array of [seq − first_seq, ts − first_ts, shape, data] (and the id's text, fifth, for tag
-- 2); `keys` holds 16 bytes an event (zeros for a text id). 0.14 KB less a packed room: the
-- packs of a served journal fit six to a 4 KB page instead of five.
-- This rewrites every pack once: a minute on a journal of millions of rooms.
-- checkpoints: kept (the view reads every event as before, column by column).

CREATE TABLE event_shapes (
  id      INTEGER PRIMARY KEY,
  type    INTEGER NOT NULL,  -- event_names.id
  engine  INTEGER NOT NULL,  -- event_names.id; 0: no engine
  source  INTEGER NOT NULL,  -- event_names.id
  shared  INTEGER NOT NULL,  -- event_shared.id; 0: no shared part
  key_tag INTEGER NOT NULL,  -- the event id's tag (event-keys.ts): 0 or 1 in `keys`, 2 its text
  UNIQUE (type, engine, source, shared, key_tag)
);

-- Schema 8's packs, an event a row, with its shape's columns: a view, read a pack at a time (a
-- table of them would hold every event of the journal at once, in memory).
CREATE TEMP VIEW packed AS
  SELECT first_seq, k, v, type, engine, source, shared, text_id,
         CASE WHEN text_id IS NOT NULL THEN 2 WHEN tag = x'01' THEN 1 ELSE 0 END AS key_tag
    FROM (
      SELECT p.first_seq, j.key AS k, j.value AS v,
             json_extract(j.value, '$[2]') AS type, json_extract(j.value, '$[3]') AS engine,
             json_extract(j.value, '$[4]') AS source, json_extract(j.value, '$[5]') AS shared,
             substr(p.keys, 17 * j.key + 1, 1) AS tag,
             -- A text id: the pack's eighth, or a 17-byte key of tag 02 (an id of 16 bytes).
             coalesce(json_extract(j.value, '$[7]'),
               CASE WHEN substr(p.keys, 17 * j.key + 1, 1) = x'02'
                    THEN CAST(substr(p.keys, 17 * j.key + 2, 16) AS TEXT) END) AS text_id
        FROM room_packs p JOIN json_each(p.events) j
       WHERE json_valid(p.events));  -- a damaged pack stays as it was: verify names it

-- In the order the packs hold them; not GROUP BY, which would sort every event of the journal.
INSERT OR IGNORE INTO event_shapes (type, engine, source, shared, key_tag)
  SELECT type, engine, source, shared, key_tag FROM temp.packed;

-- Each pack rewritten from its own columns: the expressions of `temp.packed` again, as reading
-- that view a pack at a time took 2 s more on 203,843 packs. The UPDATE's statement journal holds
-- every row it changes until it ends: migrate() keeps it on disk (temp_store = FILE), not in memory.
UPDATE room_packs SET
  events = (
    SELECT json_group_array(CASE WHEN x.key_tag = 2
        THEN json_array(x.v -> '$[0]', x.v -> '$[1]', h.id, x.v -> '$[6]', x.text_id)
        ELSE json_array(x.v -> '$[0]', x.v -> '$[1]', h.id, x.v -> '$[6]') END ORDER BY x.k)
      FROM (SELECT k, v, type, engine, source, shared, text_id,
                   CASE WHEN text_id IS NOT NULL THEN 2 WHEN tag = x'01' THEN 1 ELSE 0 END AS key_tag
              FROM (SELECT j.key AS k, j.value AS v,
                           json_extract(j.value, '$[2]') AS type, json_extract(j.value, '$[3]') AS engine,
                           json_extract(j.value, '$[4]') AS source, json_extract(j.value, '$[5]') AS shared,
                           substr(room_packs.keys, 17 * j.key + 1, 1) AS tag,
                           coalesce(json_extract(j.value, '$[7]'),
                             CASE WHEN substr(room_packs.keys, 17 * j.key + 1, 1) = x'02'
                                  THEN CAST(substr(room_packs.keys, 17 * j.key + 2, 16) AS TEXT) END) AS text_id
                      FROM json_each(room_packs.events) j)) x
      JOIN event_shapes h ON h.type = x.type AND h.engine = x.engine AND h.source = x.source
                         AND h.shared = x.shared AND h.key_tag = x.key_tag),
  keys = (
    SELECT CAST(group_concat(CASE WHEN json_extract(j.value, '$[7]') IS NOT NULL
                                    OR substr(room_packs.keys, 17 * j.key + 1, 1) = x'02' THEN zeroblob(16)
                                  ELSE substr(room_packs.keys, 17 * j.key + 2, 16) END, '' ORDER BY j.key) AS BLOB)
      FROM json_each(room_packs.events) j)
 WHERE json_valid(events);

DROP VIEW temp.packed;

DROP VIEW events;
CREATE VIEW events (seq, ts, type, room, engine, source, event_id, data) AS
  SELECT e.seq, e.ts, t.name, r.room, g.name, s.name, e.event_id,
         CASE WHEN e.shared IS NULL THEN e.data
              ELSE json_patch(e.data, (SELECT json FROM event_shared WHERE id = e.shared)) END
    FROM event_rows e
    LEFT JOIN event_names t ON t.id = e.type
    LEFT JOIN event_rooms r ON r.id = e.room
    LEFT JOIN event_names g ON g.id = e.engine
    LEFT JOIN event_names s ON s.id = e.source
  UNION ALL
  SELECT p.first_seq + json_extract(j.value, '$[0]'), p.first_ts + json_extract(j.value, '$[1]'),
         t.name, r.room, g.name, s.name,
         CASE h.key_tag
           WHEN 2 THEN CAST(x'02' || CAST(json_extract(j.value, '$[4]') AS BLOB) AS BLOB)
           ELSE CAST((CASE h.key_tag WHEN 1 THEN x'01' ELSE x'00' END)
                     || substr(p.keys, 16 * j.key + 1, 16) AS BLOB) END,
         CASE WHEN h.shared = 0 THEN json_extract(j.value, '$[3]')
              ELSE json_patch(json_extract(j.value, '$[3]'),
                (SELECT json FROM event_shared WHERE id = h.shared)) END
    FROM room_packs p
    JOIN rooms r ON r.id = p.room
    JOIN json_each(p.events) j
    LEFT JOIN event_shapes h ON h.id = json_extract(j.value, '$[2]')
    LEFT JOIN event_names t ON t.id = h.type
    LEFT JOIN event_names g ON g.id = h.engine
    LEFT JOIN event_names s ON s.id = h.source;

CREATE TRIGGER events_delete INSTEAD OF DELETE ON events
BEGIN
  SELECT RAISE(ABORT, 'this event is packed with its room (room_packs): prune the room instead')
   WHERE NOT EXISTS (SELECT 1 FROM event_rows WHERE seq = OLD.seq);
  DELETE FROM event_rows WHERE seq = OLD.seq;
END;
