-- pdctl journal, schema 4: the control plane's state checkpoints (not SQLite's WAL checkpoints).
-- A row holds what a control plane rebuilds at start and that no projection keeps — the prefix
-- index, each decode engine's pool registration, the cordons — as folded through `seq`. A start
-- reads it and folds only the events after `seq`, so its time does not grow with history.
-- `data` is JSON checked by `digest` (sha256 hex); a row whose digest, `format` or
-- `schema_version` does not match is ignored and the full rebuild runs (src/control/checkpoint).

CREATE TABLE state_checkpoints (
  name           TEXT    PRIMARY KEY,
  seq            INTEGER NOT NULL,
  format         INTEGER NOT NULL,
  schema_version INTEGER NOT NULL,
  written_at     INTEGER NOT NULL,
  digest         TEXT    NOT NULL,
  data           TEXT    NOT NULL
);
