-- pdctl journal, schema 8: the events of rooms that ended, packed a row per room.
-- A room's ten events took ten rows and an entry each in three indexes (`event_id`, `events_ts`,
-- `events_room_seq`): two thirds of its bytes went to finding events one at a time, which a room
-- that ended long ago no longer needs. The writer now packs a terminal room's events, once its
-- engines' releases are in (5 minutes after it ended), into one row of `room_packs`: its first
-- and last seq and ts, the events as a JSON array of [seq − first_seq, ts − first_ts, type,
-- engine, source, shared, data] (ids as in `event_rows`, 0 for no engine or no shared part, data as
-- JSON; an event id that is text, tag 02, as its text eighth), and their 17-byte event keys end
-- to end (zeros in place of a text id). The view `events` gives them back with the columns and values they had.
-- A pack spans at most 65,536 seqs and 60 seconds (a longer room takes several), so that a window
-- of seqs or of time finds its packs through `room_packs_last_seq` and `room_packs_first_ts`.
-- Nothing is packed by this migration: it adds the table and redefines the view.
-- checkpoints: kept (the view reads every event as before, column by column).

CREATE TABLE room_packs (
  first_seq INTEGER PRIMARY KEY,  -- the seq of its first event
  room      INTEGER NOT NULL,     -- rooms.id
  last_seq  INTEGER NOT NULL,
  first_ts  INTEGER NOT NULL,
  last_ts   INTEGER NOT NULL,
  events    TEXT    NOT NULL,     -- [[seq - first_seq, ts - first_ts, type, engine, source, shared, data], …]
  keys      BLOB    NOT NULL      -- the events' keys, 17 bytes each (zeros: a text id, in `events`), in order
);
CREATE INDEX room_packs_room ON room_packs (room);
CREATE INDEX room_packs_last_seq ON room_packs (last_seq);
CREATE INDEX room_packs_first_ts ON room_packs (first_ts);

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
         CASE WHEN json_extract(j.value, '$[7]') IS NULL THEN substr(p.keys, 17 * j.key + 1, 17)
              ELSE CAST(x'02' || CAST(json_extract(j.value, '$[7]') AS BLOB) AS BLOB) END,
         CASE WHEN json_extract(j.value, '$[5]') = 0 THEN json_extract(j.value, '$[6]')
              ELSE json_patch(json_extract(j.value, '$[6]'),
                (SELECT json FROM event_shared WHERE id = json_extract(j.value, '$[5]'))) END
    FROM room_packs p
    JOIN rooms r ON r.id = p.room
    JOIN json_each(p.events) j
    LEFT JOIN event_names t ON t.id = json_extract(j.value, '$[2]')
    LEFT JOIN event_names g ON g.id = json_extract(j.value, '$[3]')
    LEFT JOIN event_names s ON s.id = json_extract(j.value, '$[4]');

-- Deleting from the view deletes a row as before; an event inside a pack is refused (a pack is
-- a room's whole history: its room goes, by retention, and the pack with it).
CREATE TRIGGER events_delete INSTEAD OF DELETE ON events
BEGIN
  SELECT RAISE(ABORT, 'this event is packed with its room (room_packs): prune the room instead')
   WHERE NOT EXISTS (SELECT 1 FROM event_rows WHERE seq = OLD.seq);
  DELETE FROM event_rows WHERE seq = OLD.seq;
END;

-- A room's packs go with its row (retention deletes rooms).
CREATE TRIGGER room_packs_of_room AFTER DELETE ON rooms
BEGIN
  DELETE FROM room_packs WHERE room = OLD.id;
END;
