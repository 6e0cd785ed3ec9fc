-- pdctl journal, schema 2: who created each room.
-- `origin` is the `source` of the room's `room.created` event: `api` for client requests,
-- `canary` for health canaries, `migration` for the continuation of a migrated room, and so on.
-- Queries use it to keep the background canary's rooms out of incident listings by default.
-- Rooms of schema 1 take it from their `room.created` event; a room whose creation was pruned
-- keeps `unknown`.

ALTER TABLE rooms ADD COLUMN origin TEXT NOT NULL DEFAULT 'unknown';

UPDATE rooms SET origin = coalesce(
  (SELECT e.source FROM events e
    WHERE e.room = rooms.room AND e.type = 'room.created'
    ORDER BY e.seq LIMIT 1),
  'unknown');
