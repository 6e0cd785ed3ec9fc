-- pdctl journal on PostgreSQL, schema 2: the request each room serves (as migrations/0003 on
-- SQLite). `request_id` is the `x-request-id` journaled on the room's `room.created`; NULL for
-- rooms no request made and for rooms whose creation was pruned.

ALTER TABLE rooms ADD COLUMN request_id TEXT;

UPDATE rooms SET request_id = (
  SELECT e.data::jsonb ->> 'requestId' FROM events e
   WHERE e.room = rooms.room AND e.type = 'room.created'
   ORDER BY e.seq LIMIT 1);

CREATE INDEX rooms_request_id ON rooms (request_id) WHERE request_id IS NOT NULL;
