-- pdctl journal, PostgreSQL schema 6: the events of rooms that ended, packed a row per room, as
-- SQLite's schemas 8 and 9. A room's ten events took ten rows — each with a 24-byte tuple header
-- — and an entry each in four indexes; a room that ended long ago needs none of that. The leader
-- packs a terminal room's events, 5 minutes after it ended, into one row of `room_packs`: its
-- first and last seq and ts, its room, the events as a JSON array of
-- [seq - first_seq, ts - first_ts, shape, data(, text id)] — `shape` a row of `event_shapes`
-- (type, engine, source, the event key's tag, term, and the end of the data that rooms repeat),
-- `data` the JSON it was without that end, an event id that is text (tag 02) as its text, fifth —
-- and the events' keys end to end without their tag, 16 bytes each (zeros where the id is text).
-- The end that rooms repeat (a room.created's reservation identity, engines, model and deadline
-- table, written last: SHARED_KEYS in src/journal/packs.ts) is kept once in `event_suffixes`, as
-- text from its comma on: the view puts it back in place of the closing braces (`depth` of them:
-- the objects it is inside), so the data reads back as the text appended. The table of rows is now `event_rows`, and `events` a view of
-- rows and packs with the columns and values they had: every query of events reads as before.
-- `events` in a pack is `json`, which keeps its text as written: each event's data reads back
-- byte for byte.
-- A pack spans at most 65,536 seqs and 60 seconds (a longer room takes several), so that a window
-- of seqs or of time finds its packs through `room_packs_last_seq` and `room_packs_first_ts`.
-- Nothing is packed by this migration.
-- checkpoints: kept (the view reads every event as before, column by column).

ALTER TABLE events RENAME TO event_rows;

CREATE TABLE event_suffixes (
  id    INTEGER  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  depth SMALLINT NOT NULL,  -- the closing braces of the stored data it stands in for
  text  TEXT     NOT NULL   -- from the comma before the first repeated key to the end
);

CREATE TABLE event_shapes (
  id      INTEGER  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  type    TEXT     NOT NULL,
  engine  TEXT,
  source  TEXT     NOT NULL,
  key_tag SMALLINT NOT NULL,  -- 0: a UUID, 1: <source>/<UUID>, 2: text (event-keys.ts)
  term    BIGINT   NOT NULL,
  suffix  INTEGER             -- event_suffixes.id; NULL: the data is whole
);

CREATE TABLE room_packs (
  first_seq BIGINT PRIMARY KEY,  -- the seq of its first event
  room      TEXT   NOT NULL,
  last_seq  BIGINT NOT NULL,
  first_ts  BIGINT NOT NULL,
  last_ts   BIGINT NOT NULL,
  events    JSON   NOT NULL,     -- [[seq - first_seq, ts - first_ts, shape, data(, text id)], …]
  keys      BYTEA  NOT NULL      -- 16 bytes an event (zeros: a text id, in `events`), in order
);
CREATE INDEX room_packs_room ON room_packs (room);
CREATE INDEX room_packs_last_seq ON room_packs (last_seq, first_seq);
CREATE INDEX room_packs_first_ts ON room_packs (first_ts);

CREATE VIEW events (seq, ts, type, room, engine, source, event_id, data, term) AS
  SELECT seq, ts, type, room, engine, source, event_id, data, term FROM event_rows
  UNION ALL
  SELECT p.first_seq + (j.e ->> 0)::bigint, p.first_ts + (j.e ->> 1)::bigint,
         h.type, p.room, h.engine, h.source,
         CASE h.key_tag WHEN 2 THEN '\x02'::bytea || convert_to(j.e ->> 4, 'UTF8')
              ELSE (CASE h.key_tag WHEN 1 THEN '\x01'::bytea ELSE '\x00'::bytea END)
                   || substring(p.keys FROM 16 * (j.n - 1)::integer + 1 FOR 16) END,
         CASE WHEN h.suffix IS NULL THEN (j.e -> 3)::text
              ELSE left((j.e -> 3)::text, -x.depth) || x.text END,
         h.term
    FROM room_packs p
    CROSS JOIN LATERAL json_array_elements(p.events) WITH ORDINALITY AS j (e, n)
    LEFT JOIN event_shapes h ON h.id = (j.e ->> 2)::integer
    LEFT JOIN event_suffixes x ON x.id = h.suffix;

-- Deleting from the view deletes a row as before; an event inside a pack is refused (a pack is a
-- room's whole history: its room goes, by retention, and its packs with it).
CREATE FUNCTION events_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM event_rows WHERE seq = OLD.seq;
  IF NOT FOUND THEN
    RAISE EXCEPTION 'event % is packed with its room (room_packs): prune the room instead', OLD.seq;
  END IF;
  RETURN OLD;
END $$;
CREATE TRIGGER events_delete INSTEAD OF DELETE ON events
  FOR EACH ROW EXECUTE FUNCTION events_delete();

-- A room's packs go with its row (retention deletes rooms).
CREATE FUNCTION room_packs_of_room() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM room_packs WHERE room = OLD.room;
  RETURN OLD;
END $$;
CREATE TRIGGER room_packs_of_room AFTER DELETE ON rooms
  FOR EACH ROW EXECUTE FUNCTION room_packs_of_room();
