-- pdctl journal, schema 7: events stored compactly, read exactly as before.
-- Every event spelled out its type (17 bytes on average), source (14), engine (8) and room (17) as
-- text, and `events_room_seq` held the room's text again: a third of a room's bytes. The rows now
-- live in `event_rows` with those four as small integers — names (types, sources, engines) in
-- `event_names`, rooms in `event_rooms` — and `events` is a view with the columns and values it had,
-- so every query of docs/journal.md reads as it did. pdctl writes `event_rows`; deleting from the
-- view deletes the rows (journal export does), and a room's name goes with its last event.
-- `request.refused` is name 1 so that `events_refused` can name it by number.
-- The parts of `data` that every room repeats — a room.created's deadline table and its
-- reservation's pool, epoch and engine incarnation, a room.bootstrapped's pool and epoch — are
-- stored once in `event_shared` (`shared` names the row) and patched back into `data` by the view
-- with json_patch, byte for byte: a row is split only where the patch gives its text back exactly.
-- This copies every event once: minutes on a journal of millions of events.
-- checkpoints: kept (the view reads every event as before, column by column).

CREATE TABLE event_names (
  id   INTEGER PRIMARY KEY,
  name TEXT    NOT NULL UNIQUE
);
INSERT INTO event_names (id, name) VALUES (1, 'request.refused');
INSERT INTO event_names (name)
  SELECT type FROM events
  UNION SELECT source FROM events
  UNION SELECT engine FROM events WHERE engine IS NOT NULL
  EXCEPT SELECT 'request.refused';

-- In order of each room's first event, so that the room index grows at its right edge.
CREATE TABLE event_rooms (
  id   INTEGER PRIMARY KEY,
  room TEXT    NOT NULL UNIQUE
);
INSERT INTO event_rooms (room)
  SELECT room FROM events WHERE room IS NOT NULL GROUP BY room ORDER BY min(seq);

CREATE TABLE event_shared (
  id   INTEGER PRIMARY KEY,
  json TEXT    NOT NULL UNIQUE
);
CREATE TEMP TABLE shared_parts AS
  SELECT seq, rest, part FROM (
    SELECT seq, data,
      json_remove(data, '$.reservation.decode.pool', '$.reservation.decode.epoch',
        '$.reservation.decode.incarnation', '$.deadlinesMs') AS rest,
      json_object(
        'reservation', json_object('decode', json_object(
          'pool', json_extract(data, '$.reservation.decode.pool'),
          'epoch', json_extract(data, '$.reservation.decode.epoch'),
          'incarnation', json_extract(data, '$.reservation.decode.incarnation'))),
        'deadlinesMs', json_extract(data, '$.deadlinesMs')) AS part
    FROM events
    WHERE type = 'room.created' AND json_type(data, '$.reservation.decode.pool') = 'text'
      AND json_type(data, '$.reservation.decode.epoch') = 'integer'
      AND json_type(data, '$.reservation.decode.incarnation') = 'text'
      AND json_type(data, '$.deadlinesMs') = 'object'
    UNION ALL
    SELECT seq, data, json_remove(data, '$.pool', '$.epoch'),
      json_object('pool', json_extract(data, '$.pool'), 'epoch', json_extract(data, '$.epoch'))
    FROM events
    WHERE type = 'room.bootstrapped' AND json_type(data, '$.pool') = 'text'
      AND json_type(data, '$.epoch') = 'integer'
  ) WHERE json_patch(rest, part) = data;
INSERT INTO event_shared (json) SELECT part FROM temp.shared_parts GROUP BY part ORDER BY min(seq);

CREATE TABLE event_rows (
  seq      INTEGER PRIMARY KEY AUTOINCREMENT,
  ts       INTEGER NOT NULL,
  type     INTEGER NOT NULL,  -- event_names.id
  room     INTEGER,           -- event_rooms.id
  engine   INTEGER,           -- event_names.id
  source   INTEGER NOT NULL,  -- event_names.id
  event_id BLOB    NOT NULL UNIQUE,
  data     TEXT    NOT NULL DEFAULT '{}',  -- without the part in event_shared, if any
  shared   INTEGER                         -- event_shared.id
);
INSERT INTO event_rows (seq, ts, type, room, engine, source, event_id, data, shared)
  SELECT e.seq, e.ts, t.id, r.id, g.id, s.id, e.event_id, coalesce(p.rest, e.data), x.id
    FROM events e
    JOIN event_names t ON t.name = e.type
    LEFT JOIN event_rooms r ON r.room = e.room
    LEFT JOIN event_names g ON g.name = e.engine
    JOIN event_names s ON s.name = e.source
    LEFT JOIN temp.shared_parts p ON p.seq = e.seq
    LEFT JOIN event_shared x ON x.json = p.part
   ORDER BY e.seq;
DROP TABLE temp.shared_parts;
-- Seqs are never reused, even those of events retention deleted: keep the old high-water mark.
DELETE FROM sqlite_sequence WHERE name = 'event_rows';
INSERT INTO sqlite_sequence (name, seq) SELECT 'event_rows', seq FROM sqlite_sequence WHERE name = 'events';

DROP TABLE events;

CREATE INDEX events_room_seq ON event_rows (room, seq) WHERE room IS NOT NULL;
CREATE INDEX events_ts ON event_rows (ts);
CREATE INDEX events_refused ON event_rows (seq) WHERE type = 1;

CREATE VIEW events (seq, ts, type, room, engine, source, event_id, data) AS
  SELECT e.seq, e.ts, t.name, r.room, g.name, s.name, e.event_id,
         CASE WHEN e.shared IS NULL THEN e.data
              ELSE json_patch(e.data, (SELECT json FROM event_shared WHERE id = e.shared)) END
    FROM event_rows e
    LEFT JOIN event_names t ON t.id = e.type
    LEFT JOIN event_rooms r ON r.id = e.room
    LEFT JOIN event_names g ON g.id = e.engine
    LEFT JOIN event_names s ON s.id = e.source;

CREATE TRIGGER events_delete INSTEAD OF DELETE ON events
BEGIN
  DELETE FROM event_rows WHERE seq = OLD.seq;
END;

CREATE TRIGGER event_rooms_unused AFTER DELETE ON event_rows
  WHEN OLD.room IS NOT NULL AND NOT EXISTS (SELECT 1 FROM event_rows WHERE room = OLD.room)
BEGIN
  DELETE FROM event_rooms WHERE id = OLD.room;
END;
