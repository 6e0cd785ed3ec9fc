-- pdctl journal, schema 3: the request each room serves.
-- `request_id` is the HTTP request's `x-request-id` (the client's, or the one the API made) as
-- journaled on the room's `room.created`; a migrated room's continuation carries the same one, so
-- one request id finds every room of the request. NULL for rooms no request made (canaries,
-- drills' raw rooms) and for rooms whose creation was pruned.

ALTER TABLE rooms ADD COLUMN request_id TEXT;

UPDATE rooms SET request_id = (
  SELECT json_extract(e.data, '$.requestId') FROM events e
   WHERE e.room = rooms.room AND e.type = 'room.created'
   ORDER BY e.seq LIMIT 1);

CREATE INDEX rooms_request_id ON rooms (request_id) WHERE request_id IS NOT NULL;
