/**
 * The backend-neutral half of `pdctl journal verify`: fold every event in seq order, then compare
 * the `rooms` projection with the fold, field by field. Each backend feeds it rows and adds its
 * own storage checks (SQLite's integrity_check, say).
 */
import type { EventType } from '../room/events.ts';
import { type ReducibleEvent, type Room, reduce } from '../room/reducer.ts';
import { ROOM_COLUMNS, roomToParams } from './rows.ts';
import type { VerifyReport } from './store.ts';

const MAX_LISTED = 100;
/** Events a backend reads per page while folding. */
export const FOLD_PAGE = 5000;
const EMPTY: Record<string, unknown> = Object.freeze({}) as Record<string, unknown>;
/** Event types whose data the reducer never reads: replay skips parsing it. */
const DATA_UNUSED = new Set([
  'room.bootstrap_started',
  'room.prefill_started',
  'room.transfer_posted',
  'room.decode_started',
  'room.released',
]);

/** One `events` row, in the order the fold takes it. */
export type FoldRow = [
  seq: number,
  ts: number,
  type: string,
  room: string | null,
  engine: string | null,
  source: string,
  data: string,
];

/** The columns of a FoldRow, for a backend's SELECT. */
export const FOLD_COLUMNS = 'seq, ts, type, room, engine, source, data';

export class JournalFold {
  readonly rooms = new Map<string, Room>();
  events = 0;
  lastSeq = 0;
  readonly inconsistent: VerifyReport['inconsistent'] = [];
  readonly problems: string[] = [];
  /** One event object, rewritten from each row (the read boundary) and folded as its type. */
  private readonly ev = {
    seq: 0,
    ts: 0,
    type: 'room.created' as EventType,
    room: null as string | null,
    engine: null as string | null,
    source: '',
    data: EMPTY as unknown,
  };

  /** Folds one page of rows; the pages come in seq order. */
  add(rows: FoldRow[]): void {
    const ev = this.ev;
    for (const row of rows) {
      this.events++;
      const [seq, ts, type, room, engine, source, data] = row;
      if (seq <= this.lastSeq && this.problems.length < MAX_LISTED) {
        this.problems.push(`seq ${seq} does not follow ${this.lastSeq}`);
      }
      this.lastSeq = seq;
      if (room === null || type === 'room.event_rejected' || !type.startsWith('room.')) continue;
      ev.seq = seq;
      ev.ts = ts;
      ev.type = type as EventType;
      ev.room = room;
      ev.engine = engine;
      ev.source = source;
      ev.data = DATA_UNUSED.has(type) ? EMPTY : JSON.parse(data);
      const r = reduce(this.rooms.get(room) ?? null, ev as ReducibleEvent);
      if (r.ok) this.rooms.set(room, r.room);
      else if (this.inconsistent.length < MAX_LISTED) {
        this.inconsistent.push({ seq, reason: `${r.reason}: ${r.detail}` });
      }
    }
  }
}

/** Compares `rooms` rows (columns in ROOM_COLUMNS order) with the fold. */
export class ProjectionCheck {
  readonly mismatches: VerifyReport['mismatches'] = [];
  readonly extra: string[] = [];
  projected = 0;
  private readonly seen = new Set<string>();

  constructor(private readonly fold: JournalFold) {}

  row(row: ReadonlyArray<string | number | null>): void {
    this.projected++;
    const name = row[0] as string;
    const folded = this.fold.rooms.get(name);
    if (!folded) {
      if (this.extra.length < MAX_LISTED) this.extra.push(name);
      return;
    }
    this.seen.add(name);
    const expected = roomToParams(folded);
    for (let i = 0; i < expected.length; i++) {
      if (row[i] !== expected[i] && this.mismatches.length < MAX_LISTED) {
        this.mismatches.push({
          room: name,
          field: ROOM_COLUMNS[i] as string,
          projection: row[i],
          fold: expected[i],
        });
      }
    }
  }

  /** The report, from the fold, this comparison and the backend's own problems. */
  report(integrity: string, problems: string[], startedNs: bigint): VerifyReport {
    const missing: string[] = [];
    if (this.seen.size !== this.fold.rooms.size) {
      for (const name of this.fold.rooms.keys()) {
        if (!this.seen.has(name) && missing.length < MAX_LISTED) missing.push(name);
      }
    }
    const all = [...this.fold.problems, ...problems];
    const ok =
      all.length === 0 &&
      this.mismatches.length === 0 &&
      missing.length === 0 &&
      this.extra.length === 0 &&
      this.fold.inconsistent.length === 0;
    return {
      ok,
      integrity,
      events: this.fold.events,
      rooms: this.projected,
      mismatches: this.mismatches,
      missing,
      extra: this.extra,
      inconsistent: this.fold.inconsistent,
      problems: all,
      micros: Number((process.hrtime.bigint() - startedNs) / 1000n),
    };
  }
}

/** Consumer cursors past the newest event: a consumer cannot have applied what does not exist. */
export function cursorProblems(cursors: Array<{ name: string; seq: number }>, maxSeq: number) {
  return cursors
    .filter((c) => c.seq > maxSeq)
    .map((c) => `consumer ${c.name} is at seq ${c.seq}, past the newest event ${maxSeq}`);
}
