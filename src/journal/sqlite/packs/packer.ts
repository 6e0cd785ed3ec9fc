/** The writer's side of packs: terminal rooms' rows packed, a short transaction at a time. */
import type Database from 'better-sqlite3';
import { KEY_BYTES, PACK_SPAN_MS, PACK_SPAN_SEQS } from './sql.ts';

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

/** One pack as the packer builds it. */
interface Pack {
  firstSeq: number;
  lastSeq: number;
  firstTs: number;
  lastTs: number;
  rows: StoredRow[];
}

export interface PackPass {
  /** Rooms packed, and the events they held. */
  rooms: number;
  events: number;
  /** Rooms looked at and left as rows: an event id that is not a 17-byte key, or data that would not read back the same. */
  skipped: number;
  /** Whether the pass reached the cut-off (false: more rooms wait). */
  done: boolean;
}

/**
 * Packs terminal rooms, a short transaction at a time, on the writer's connection. It walks
 * `rooms_terminal_at` from where its last pass stopped (in memory: a restart walks once from the
 * oldest, skipping rooms packed already at one lookup each).
 */
export class Packer {
  private readonly pick: Database.Statement;
  private readonly roomKey: Database.Statement;
  private readonly rowsOf: Database.Statement;
  private readonly insert: Database.Statement;
  private readonly render: Database.Statement;
  private readonly deleteRows: Database.Statement;
  /** Where the last pass stopped: (terminal_at, id) of the last room it looked at. */
  private after: [number, number] = [Number.MIN_SAFE_INTEGER, 0];

  /** `onPacked(room)`: after COMMIT, for each room packed (its `event_rooms` id is gone). */
  constructor(
    private readonly db: Database.Database,
    private readonly onPacked: (room: string) => void,
  ) {
    this.pick = db
      .prepare(
        `SELECT id, room, terminal_at FROM rooms
          WHERE terminal_at IS NOT NULL AND (terminal_at, id) > (?, ?) AND terminal_at < ?
          ORDER BY terminal_at, id LIMIT ?`,
      )
      .raw();
    this.roomKey = db.prepare('SELECT id FROM event_rooms WHERE room = ?').pluck();
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
  }

  /** Packs rooms that ended before `cutoffTs`, looking at up to `limit` rooms, in one transaction. */
  pass(cutoffTs: number, limit: number): PackPass {
    const packed: string[] = [];
    const picked = this.pick.all(this.after[0], this.after[1], cutoffTs, limit) as Array<
      [number, string, number]
    >;
    const pass = this.db
      .transaction(() => {
        const pass: PackPass = { rooms: 0, events: 0, skipped: 0, done: picked.length < limit };
        for (const [id, room] of picked) {
          const key = this.roomKey.get(room) as number | undefined;
          if (key === undefined) continue; // packed already, or no event of its own left
          const rows = this.rowsOf.all(key) as StoredRow[];
          const packs = packsOf(rows);
          const texts = packs?.map(packText) ?? [];
          if (!packs || !texts.every((text) => this.render.get(text) === text)) {
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
              Buffer.concat(p.rows.map((r) => r.event_id)),
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
    const last = picked[picked.length - 1];
    if (last) this.after = [last[2], last[0]];
    for (const room of packed) this.onPacked(room);
    return pass;
  }
}

/** A room's rows as packs within the spans, or null when a key is not 17 bytes. */
function packsOf(rows: StoredRow[]): Pack[] | null {
  const packs: Pack[] = [];
  let cur: Pack | null = null;
  for (const r of rows) {
    if (r.event_id.length !== KEY_BYTES) return null;
    if (
      cur &&
      r.seq - cur.firstSeq < PACK_SPAN_SEQS &&
      Math.max(cur.lastTs, r.ts) - Math.min(cur.firstTs, r.ts) <= PACK_SPAN_MS
    ) {
      cur.rows.push(r);
      cur.lastSeq = r.seq;
      cur.firstTs = Math.min(cur.firstTs, r.ts);
      cur.lastTs = Math.max(cur.lastTs, r.ts);
    } else {
      cur = { firstSeq: r.seq, lastSeq: r.seq, firstTs: r.ts, lastTs: r.ts, rows: [r] };
      packs.push(cur);
    }
  }
  return packs;
}

/**
 * The `events` column of a pack: its rows relative to its first seq and its earliest ts, 0 for no
 * engine and no shared part (ids start at 1; `null` would take four bytes).
 */
function packText(p: Pack): string {
  const parts = p.rows.map(
    (r) =>
      `[${r.seq - p.firstSeq},${r.ts - p.firstTs},${r.type},${r.engine ?? 0},${r.source},${r.shared ?? 0},${r.data}]`,
  );
  return `[${parts.join(',')}]`;
}
