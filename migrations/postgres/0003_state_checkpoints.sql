-- pdctl journal on PostgreSQL, schema 3: the control plane's state checkpoints (as
-- migrations/0004 on SQLite). What a control plane rebuilds at start and no projection keeps,
-- folded through `seq`; the leader writes it, a standby that takes over reads it, so a failover
-- folds only the events after it. Ignored when `digest`, `format` or `schema_version` do not match.

CREATE TABLE state_checkpoints (
  name           TEXT   PRIMARY KEY,
  seq            BIGINT NOT NULL,
  format         INTEGER NOT NULL,
  schema_version INTEGER NOT NULL,
  written_at     BIGINT NOT NULL,
  digest         TEXT   NOT NULL,
  data           TEXT   NOT NULL
);
