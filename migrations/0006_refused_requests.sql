-- pdctl journal, schema 6: refused requests found by their id.
-- A request refused before it had a room (429, 503) is on the record only inside a
-- `request.refused` event (the first 20 ids per reason and second, in `data.requestIds`). Looking
-- one up (`pdctl room ID`, `/v1/journal?request_id=`) reads those events; this index holds just
-- them, so the lookup reads a handful of rows instead of every event.
-- checkpoints: kept (an index only).

CREATE INDEX events_refused ON events (seq) WHERE type = 'request.refused';
