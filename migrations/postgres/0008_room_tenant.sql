-- pdctl journal on PostgreSQL, schema 8: the tenant each room serves (as migrations/0010 on
-- SQLite). `tenant` is the tenant journaled on the room's `room.created`; NULL on an open API,
-- for rooms no request made and for rooms whose creation was pruned.
-- checkpoints: kept

ALTER TABLE rooms ADD COLUMN tenant TEXT;

-- Nothing to fill in: no room before this schema had a tenant (`room.created.tenant` came with it).
CREATE INDEX rooms_tenant ON rooms (tenant, created_at) WHERE tenant IS NOT NULL;
