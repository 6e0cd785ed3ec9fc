-- pdctl journal, schema 10: the tenant each room serves.
-- checkpoints: kept
-- `tenant` is the tenant whose key the request came with, as journaled on the room's
-- `room.created` (a migrated or retried room's too), so that "what did tenant X run" is a query
-- of the rooms table. NULL on an open API, for rooms no request made (canaries), and for rooms
-- whose creation was pruned.

ALTER TABLE rooms ADD COLUMN tenant TEXT;

-- Nothing to fill in: no room before this schema had a tenant (`room.created.tenant` came with it).
CREATE INDEX rooms_tenant ON rooms (tenant, created_at) WHERE tenant IS NOT NULL;
