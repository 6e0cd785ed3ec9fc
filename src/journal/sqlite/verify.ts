/**
 * `pdctl journal verify`: SQLite's integrity check, the ordering and bookkeeping invariants of
 * `events`, and a rebuild of the `rooms` projection from scratch, compared field by field.
 */
import type Database from 'better-sqlite3';
import type { EventType } from '../events.ts';
import { type ReducibleEvent, type Room, reduce } from '../reducer.ts';
import type { VerifyReport } from '../store.ts';
import { ROOM_COLUMNS, roomToParams } from './rows.ts';

const MAX_LISTED = 100;
const FOLD_PAGE = 5000;
const EMPTY: Record<string, unknown> = Object.freeze({}) as Record<string, unknown>;
/** Event types whose data the reducer never reads: replay skips parsing it. */
const DATA_UNUSED = new Set([
  'room.bootstrap_started',
  'room.prefill_started',
  'room.transfer_posted',
  'room.decode_started',
  'room.released',
]);

export interface FoldResult {
  rooms: Map<string, Room>;
  events: number;
  inconsistent: Array<{ seq: number; reason: string }>;
  problems: string[];
}

/** Folds every event of the journal in seq order, straight off the rows. */
export function foldJournal(db: Database.Database): FoldResult {
  const rooms = new Map<string, Room>();
  const inconsistent: FoldResult['inconsistent'] = [];
  const problems: string[] = [];
  let events = 0;
  let prevSeq = 0;
  const ev: ReducibleEvent = {
    seq: 0,
    ts: 0,
    type: 'room.created',
    room: null,
    engine: null,
    source: '',
    data: {},
  };
  const page = db
    .prepare(
      'SELECT seq, ts, type, room, engine, source, data FROM events WHERE seq > ? ORDER BY seq LIMIT ?',
    )
    .raw();
  // Pages of rows via all() are faster than iterate() (fewer crossings into the addon).
  for (;;) {
    const rows = page.all(prevSeq, FOLD_PAGE) as Array<
      [number, number, string, string | null, string | null, string, string]
    >;
    for (const row of rows) {
      events++;
      const [seq, ts, type, room, engine, source, data] = row;
      if (seq <= prevSeq && problems.length < MAX_LISTED) {
        problems.push(`seq ${seq} does not follow ${prevSeq}`);
      }
      prevSeq = seq;
      if (room === null || type === 'room.event_rejected' || !type.startsWith('room.')) continue;
      ev.seq = seq;
      ev.ts = ts;
      ev.type = type as EventType;
      ev.room = room;
      ev.engine = engine;
      ev.source = source;
      ev.data = DATA_UNUSED.has(type) ? EMPTY : (JSON.parse(data) as Record<string, unknown>);
      const r = reduce(rooms.get(room) ?? null, ev);
      if (r.ok) rooms.set(room, r.room);
      else if (inconsistent.length < MAX_LISTED) {
        inconsistent.push({ seq, reason: `${r.reason}: ${r.detail}` });
      }
    }
    if (rows.length < FOLD_PAGE) break;
  }
  return { rooms, events, inconsistent, problems };
}

export function verifyJournal(db: Database.Database): VerifyReport {
  const started = process.hrtime.bigint();
  const integrity = (db.prepare('PRAGMA integrity_check').pluck().all() as string[]).join('; ');
  const fold = foldJournal(db);
  const problems = [...fold.problems];
  if (integrity !== 'ok') problems.push(`integrity_check: ${integrity}`);

  const sequence = db
    .prepare("SELECT seq FROM sqlite_sequence WHERE name = 'events'")
    .pluck()
    .get() as number | undefined;
  const maxSeq = db.prepare('SELECT coalesce(max(seq), 0) FROM events').pluck().get() as number;
  if (sequence !== undefined && sequence < maxSeq) {
    problems.push(`sqlite_sequence (${sequence}) is behind the newest seq (${maxSeq})`);
  }
  const ahead = db.prepare('SELECT name, seq FROM consumers WHERE seq > ?').all(maxSeq) as Array<{
    name: string;
    seq: number;
  }>;
  for (const c of ahead)
    problems.push(`consumer ${c.name} is at seq ${c.seq}, past the newest event ${maxSeq}`);

  const mismatches: VerifyReport['mismatches'] = [];
  const extra: string[] = [];
  const seen = new Set<string>();
  const stmt = db.prepare(`SELECT ${ROOM_COLUMNS.join(', ')} FROM rooms`).raw();
  let projected = 0;
  for (const row of stmt.iterate() as IterableIterator<Array<string | number | null>>) {
    projected++;
    const name = row[0] as string;
    const folded = fold.rooms.get(name);
    if (!folded) {
      if (extra.length < MAX_LISTED) extra.push(name);
      continue;
    }
    seen.add(name);
    const expected = roomToParams(folded);
    for (let i = 0; i < expected.length; i++) {
      if (row[i] !== expected[i] && mismatches.length < MAX_LISTED) {
        mismatches.push({
          room: name,
          field: ROOM_COLUMNS[i] as string,
          projection: row[i],
          fold: expected[i],
        });
      }
    }
  }
  const missing: string[] = [];
  if (seen.size !== fold.rooms.size) {
    for (const name of fold.rooms.keys()) {
      if (!seen.has(name) && missing.length < MAX_LISTED) missing.push(name);
    }
  }
  const ok =
    problems.length === 0 &&
    mismatches.length === 0 &&
    missing.length === 0 &&
    extra.length === 0 &&
    fold.inconsistent.length === 0;
  return {
    ok,
    integrity,
    events: fold.events,
    rooms: projected,
    mismatches,
    missing,
    extra,
    inconsistent: fold.inconsistent,
    problems,
    micros: Number((process.hrtime.bigint() - started) / 1000n),
  };
}
