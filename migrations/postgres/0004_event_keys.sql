-- pdctl journal, PostgreSQL schema 4: event ids stored as short keys (src/journal/event-keys.ts),
-- as SQLite's schema 5: a tag byte, then 16 bytes of a UUID (0x00), of `<source>/<UUID>` (0x01: an
-- engine's id in its namespace), or the id's UTF-8 (0x02). The column keeps its name and its UNIQUE
-- constraint; its type is bytea from now on. Read one by hand with encode(event_id, 'hex').
-- This rewrites the table once: minutes on a journal of millions of events.
-- checkpoints: kept (pdctl reads every event as before: a key reads back as the id it encodes).

ALTER TABLE events ALTER COLUMN event_id TYPE bytea USING (CASE
  WHEN event_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
    THEN '\x00'::bytea || decode(replace(event_id, '-', ''), 'hex')
  WHEN length(event_id) = length(source) + 37
       AND starts_with(event_id, source || '/')
       AND substr(event_id, length(source) + 2) ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
    THEN '\x01'::bytea || decode(replace(substr(event_id, length(source) + 2), '-', ''), 'hex')
  ELSE '\x02'::bytea || convert_to(event_id, 'UTF8')
END);
