-- pdctl journal, schema 1.
-- `events` is the source of truth: append-only, one row per committed event, never updated.
-- `rooms` is the projection of each room's current state, written in the same transaction as
-- the events that change it; `pdctl journal verify` rebuilds it from `events` and compares.
-- Times are unix milliseconds.

CREATE TABLE events (
  seq      INTEGER PRIMARY KEY AUTOINCREMENT,
  ts       INTEGER NOT NULL,
  type     TEXT    NOT NULL,
  room     TEXT,
  engine   TEXT,
  source   TEXT    NOT NULL,
  event_id TEXT    NOT NULL UNIQUE,
  data     TEXT    NOT NULL DEFAULT '{}'
);
CREATE INDEX events_room_seq ON events (room, seq) WHERE room IS NOT NULL;
CREATE INDEX events_ts ON events (ts);

CREATE TABLE rooms (
  id                INTEGER PRIMARY KEY,  -- internal: lets the writer update a row without a key lookup
  room              TEXT    NOT NULL UNIQUE,
  state             TEXT    NOT NULL,
  prefill_engine    TEXT    NOT NULL,
  decode_engine     TEXT    NOT NULL,
  created_at        INTEGER NOT NULL,
  updated_at        INTEGER NOT NULL,
  state_since       INTEGER NOT NULL,
  deadline_at       INTEGER,           -- when the current state's deadline passes; NULL if terminal
  terminal_at       INTEGER,
  reason            TEXT,              -- why it was aborted or failed
  failed_stage      TEXT,
  detected_by       TEXT,
  abort_source      TEXT,
  abort_requested_at INTEGER,
  abort_reason      TEXT,
  migrated_from     TEXT,
  migrated_to       TEXT,
  prompt_tokens     INTEGER,
  max_tokens        INTEGER,
  kv_pages          INTEGER,
  transfer_bytes    INTEGER,
  transfer_micros   INTEGER,
  checksum          TEXT,
  tokens            INTEGER,
  finish_reason     TEXT,
  released_by       TEXT    NOT NULL DEFAULT '[]',  -- JSON array of engine ids
  deadlines_ms      TEXT    NOT NULL,               -- JSON array: deadline per live state, in state order
  last_seq          INTEGER NOT NULL,
  event_count       INTEGER NOT NULL
);
-- Few indexes on purpose: every one is rewritten by appends. The partial deadline index serves
-- the watchdog (live rooms only); state and reason filters scan, which is fast at this size.
CREATE INDEX rooms_created_at ON rooms (created_at);
CREATE INDEX rooms_terminal_at ON rooms (terminal_at) WHERE terminal_at IS NOT NULL;
CREATE INDEX rooms_live_deadline ON rooms (deadline_at) WHERE deadline_at IS NOT NULL;

-- Durable cursors of asynchronous journal consumers: the last seq each has applied.
CREATE TABLE consumers (
  name       TEXT PRIMARY KEY,
  seq        INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
