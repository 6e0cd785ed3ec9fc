-- pdctl journal on PostgreSQL, schema 1: the same tables and columns as the SQLite journal
-- (migrations/0001 and 0002), plus leadership for more than one control plane.
-- `events` is the source of truth: append-only, one row per committed event, never updated.
-- `rooms` is the projection of each room's current state, written in the same transaction as
-- the events that change it. Times are unix milliseconds.

CREATE TABLE events (
  -- Assigned by the leader, in commit order: only one session writes (see `leadership`).
  seq      BIGINT PRIMARY KEY,
  ts       BIGINT NOT NULL,
  type     TEXT   NOT NULL,
  room     TEXT,
  engine   TEXT,
  source   TEXT   NOT NULL,
  event_id TEXT   NOT NULL UNIQUE,
  data     TEXT   NOT NULL DEFAULT '{}',
  -- The leadership term of the control plane that wrote it (fencing: see `leadership`).
  term     BIGINT NOT NULL
);
CREATE INDEX events_room_seq ON events (room, seq) WHERE room IS NOT NULL;
CREATE INDEX events_ts ON events (ts);

CREATE TABLE rooms (
  room               TEXT   PRIMARY KEY,
  state              TEXT   NOT NULL,
  prefill_engine     TEXT   NOT NULL,
  decode_engine      TEXT   NOT NULL,
  created_at         BIGINT NOT NULL,
  updated_at         BIGINT NOT NULL,
  state_since        BIGINT NOT NULL,
  deadline_at        BIGINT,           -- when the current state's deadline passes; NULL if terminal
  terminal_at        BIGINT,
  reason             TEXT,             -- why it was aborted or failed
  failed_stage       TEXT,
  detected_by        TEXT,
  abort_source       TEXT,
  abort_requested_at BIGINT,
  abort_reason       TEXT,
  migrated_from      TEXT,
  migrated_to        TEXT,
  prompt_tokens      BIGINT,
  max_tokens         BIGINT,
  kv_pages           BIGINT,
  transfer_bytes     BIGINT,
  transfer_micros    BIGINT,
  checksum           TEXT,
  tokens             BIGINT,
  finish_reason      TEXT,
  released_by        TEXT   NOT NULL DEFAULT '[]',  -- JSON array of engine ids
  deadlines_ms       TEXT   NOT NULL,               -- JSON array: deadline per live state, in state order
  last_seq           BIGINT NOT NULL,
  event_count        BIGINT NOT NULL,
  origin             TEXT   NOT NULL DEFAULT 'unknown'  -- source of the room's room.created
);
CREATE INDEX rooms_created_at ON rooms (created_at);
CREATE INDEX rooms_terminal_at ON rooms (terminal_at) WHERE terminal_at IS NOT NULL;
CREATE INDEX rooms_live_deadline ON rooms (deadline_at) WHERE deadline_at IS NOT NULL;

-- Durable cursors of asynchronous journal consumers: the last seq each has applied.
CREATE TABLE consumers (
  name       TEXT   PRIMARY KEY,
  seq        BIGINT NOT NULL,
  updated_at BIGINT NOT NULL
);

-- Who leads the journal. One row. The leader holds a session advisory lock, renews its lease,
-- and every append checks (FOR SHARE) that `term` is still its own in the same transaction, so a
-- deposed leader's writes are refused. A contender takes over when the lock is free (the leader's
-- session is gone: killed, crashed) or the lease has run out (the leader is frozen; its session
-- is then terminated), and takes term + 1.
CREATE TABLE leadership (
  id          SMALLINT PRIMARY KEY CHECK (id = 1),
  term        BIGINT NOT NULL,
  holder      TEXT,     -- the leader's id: host, pid and its endpoints
  backend_pid INTEGER,  -- the leader's writing session, terminated when its lease has run out
  lease_until BIGINT NOT NULL,  -- database clock, unix ms
  acquired_at BIGINT NOT NULL
);
INSERT INTO leadership (id, term, holder, backend_pid, lease_until, acquired_at) VALUES (1, 0, NULL, NULL, 0, 0);

-- Every term ever taken, for the incident review: who led, from when, and how it got there.
CREATE TABLE leader_terms (
  term        BIGINT PRIMARY KEY,
  holder      TEXT   NOT NULL,
  acquired_at BIGINT NOT NULL,
  -- vacant: nobody led · resigned: the leader shut down and handed over · holder_gone: the
  -- leader's session had ended (killed, crashed) · lease_expired: the leader stopped renewing
  -- (frozen) and its session was terminated
  how         TEXT   NOT NULL,
  previous    TEXT   -- the holder before
);
