-- pdctl journal, PostgreSQL schema 5: refused requests found by their id, as SQLite's schema 6.
-- Looking a refused request up reads the `request.refused` events (their `data.requestIds`); this
-- index holds just them.
-- checkpoints: kept (an index only).

CREATE INDEX events_refused ON events (seq) WHERE type = 'request.refused';
