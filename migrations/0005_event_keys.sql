-- pdctl journal, schema 5: event ids stored as short keys (src/journal/event-keys.ts).
-- An id is kept twice, in the row and in the unique index that makes a retried append a duplicate;
-- as text it took 51 bytes a row on average (`engine:decode-0/` and a 36-character UUID), which
-- with its index was a fifth of a room's bytes. The key is a tag byte and then:
--   0x00 + 16 bytes: a UUID; 0x01 + 16 bytes: `<source>/<UUID>`, an engine's id in its namespace;
--   0x02 + UTF-8: any other id as it is.
-- The column keeps its name and its UNIQUE index; it holds BLOBs from now on. Read one by hand with
-- hex(event_id), or with `pdctl room --json`, which shows ids as text.
-- This rewrites every event's key once: minutes on a journal of millions of events.
-- checkpoints: kept (pdctl reads every event as before: a key reads back as the id it encodes).

UPDATE events SET event_id = CASE
  WHEN length(event_id) = 36 AND event_id GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'
    THEN unhex('00' || replace(event_id, '-', ''))
  WHEN length(event_id) = length(source) + 37
       AND substr(event_id, 1, length(source) + 1) = source || '/'
       AND substr(event_id, length(source) + 2) GLOB '[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f]-[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]'
    THEN unhex('01' || replace(substr(event_id, length(source) + 2), '-', ''))
  ELSE unhex('02' || hex(event_id))
END;
