/** The writer's side of packs: terminal rooms' rows packed, a short transaction at a time. */
import type Database from 'better-sqlite3';
import { keyFits, type Pack, packedEvent, packKeys, packsOf } from '../../packs.ts';
import { IdTable } from '../event-rows.ts';

/** A row of `event_rows` as the packer reads it. */
interface StoredRow {
  seq: number;
  ts: number;
  type: number;
  engine: number | null;
  source: number;
  shared: number | null;
  event_id: Buffer;
  data: string;
}

export interface PackPass {
  /** Rooms packed, and the events they held. */
  rooms: number;
  events: number;
  /**
   * Rooms that ended in time left as rows: SQLite would not render their pack back byte for byte,
   * or an event id is not UTF-8.
   */
  skipped: number;
  /** The last `event_rooms` id it looked at: the next pass of the same run goes on after it. */
  lastKey: number;
  /** Whether the run is done (false: more rooms wait). */
  done: boolean;
}

/**
 * Packs terminal rooms, a short transaction at a time, on the writer's connection. A run walks
 * `event_rooms` — the rooms that still have rows — in the order of their first events, from the
 * oldest, never the rooms packed before. A quick run ends at the first room created after the
 * cut-off, so it looks at the rooms it packs and at the few before them still live or ended too
 * lately; a whole run walks every room with rows, for rooms whose times are out of the order of
 * their first events (a clock behind the others, a journal written out of order).
 */
export class Packer {
  private readonly pick: Database.Statement;
  private readonly rowsOf: Database.Statement;
  private readonly insert: Database.Statement;
  private readonly render: Database.Statement;
  private readonly deleteRows: Database.Statement;
  private readonly shapes: IdTable;

  /** `onPacked(room)`: after COMMIT, for each room packed (its `event_rooms` id is gone). */
  constructor(
    private readonly db: Database.Database,
    private readonly onPacked: (room: string) => void,
  ) {
    this.pick = db
      .prepare(
        `SELECT k.id, x.id, x.room, x.created_at, x.terminal_at
           FROM event_rooms k JOIN rooms x ON x.room = k.room
          WHERE k.id > ? ORDER BY k.id LIMIT ?`,
      )
      .raw();
    this.rowsOf = db.prepare(
      `SELECT seq, ts, type, engine, source, shared, event_id, data FROM event_rows
        WHERE room = ? ORDER BY seq`,
    );
    this.insert = db.prepare(
      `INSERT INTO room_packs (first_seq, room, last_seq, first_ts, last_ts, events, keys)
       VALUES (?, ?, ?, ?, ?, ?, ?)`,
    );
    // SQLite's own rendering of a pack's text: where it is the text itself, every part the view
    // extracts (an event's data above all) renders as the text it came from, byte for byte.
    this.render = db.prepare('SELECT json(?)').pluck();
    this.deleteRows = db.prepare('DELETE FROM event_rows WHERE room = ? AND seq <= ?');
    this.shapes = shapeIds(db);
  }

  /**
   * Packs up to `limit` rooms that ended before `cutoffTs`, after `afterKey` (an `event_rooms` id;
   * 0 to start a run), in one transaction, looking at up to LOOKS_PER_PACK times as many (those
   * not ready take a lookup each); `whole`: a whole run's pass.
   */
  pass(cutoffTs: number, limit: number, afterKey: number, whole: boolean): PackPass {
    const packed: string[] = [];
    const looks = limit * LOOKS_PER_PACK;
    const picked = this.pick.all(afterKey, looks) as Array<
      [number, number, string, number, number | null]
    >;
    // Shapes a failed pass added were not stored: forget them.
    this.shapes.rollback();
    const pass = this.db
      .transaction(() => {
        const pass: PackPass = {
          rooms: 0,
          events: 0,
          skipped: 0,
          lastKey: afterKey,
          done: picked.length < looks,
        };
        for (const [key, id, room, createdAt, terminalAt] of picked) {
          if (pass.rooms + pass.skipped === limit) {
            pass.done = false; // more may wait after the last it looked at
            break;
          }
          if (createdAt >= cutoffTs && !whole) {
            pass.done = true; // rooms after it began later, but for a few out of order
            break;
          }
          pass.lastKey = key;
          if (terminalAt === null || terminalAt >= cutoffTs) continue; // live, or ended lately
          const rows = this.rowsOf.all(key) as StoredRow[];
          if (!rows.every((r) => keyFits(r.event_id))) {
            pass.skipped++;
            continue;
          }
          const packs = packsOf(rows);
          const texts = packs.map((p) => packText(p, this.shapes));
          if (!texts.every((text) => this.render.get(text) === text)) {
            pass.skipped++;
            continue;
          }
          packs.forEach((p, i) => {
            this.insert.run(
              p.firstSeq,
              id,
              p.lastSeq,
              p.firstTs,
              p.lastTs,
              texts[i],
              packKeys(p.rows.map((r) => r.event_id)),
            );
          });
          this.deleteRows.run(key, (rows[rows.length - 1] as StoredRow).seq);
          packed.push(room);
          pass.rooms++;
          pass.events += rows.length;
        }
        return pass;
      })
      .immediate();
    this.shapes.commit();
    for (const room of packed) this.onPacked(room);
    return pass;
  }
}

/** Rooms a pass may look at for each it may pack: rooms still live or ended lately cost a lookup. */
const LOOKS_PER_PACK = 8;

/**
 * The ids of `event_shapes` (schema 9), by an event's type, engine, source, shared part and key
 * tag joined by commas.
 */
function shapeIds(db: Database.Database): IdTable {
  const rows = db
    .prepare('SELECT type, engine, source, shared, key_tag, id FROM event_shapes')
    .raw()
    .all() as number[][];
  const insert = db.prepare(
    'INSERT INTO event_shapes (type, engine, source, shared, key_tag) VALUES (?, ?, ?, ?, ?)',
  );
  return new IdTable(
    rows.map((r) => [r.slice(0, 5).join(','), r[5] as number]),
    (shape) => Number(insert.run(...shape.split(',').map(Number)).lastInsertRowid),
  );
}

/** The shape of a row, as `shapeIds` keys it. */
const shapeOf = (r: StoredRow): string =>
  `${r.type},${r.engine ?? 0},${r.source},${r.shared ?? 0},${r.event_id[0]}`;

/**
 * The `events` column of a pack (schema 9): its rows relative to its first seq and its earliest
 * ts, each with its shape (`event_shapes`) and its data as JSON, and an id that is text (tag 02:
 * event-keys.ts) as its text, fifth.
 */
function packText(p: Pack<StoredRow>, shapes: IdTable): string {
  return `[${p.rows.map((r) => packedEvent(p, r, shapes.id(shapeOf(r)))).join(',')}]`;
}
