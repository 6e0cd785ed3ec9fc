/**
 * The leader's side of packed rooms on PostgreSQL (schemas 6 and 7, migrations/postgres/
 * 0006_room_packs.sql and 0007_event_layouts.sql): terminal rooms' rows packed a room a row, a
 * short transaction at a time, each event's data laid out by its shape where it can be (layout.ts).
 */
import type pg from 'pg';
import {
  keyFits,
  type PackTotals,
  packedEvent,
  packKeys,
  packsOf,
  sharedSuffix,
} from '../../packs.ts';
import { layOut } from './layout.ts';
import type { Run } from './reads.ts';
import { COLUMNS } from './sql.ts';

/** A row of `event_rows` as the packer reads it. */
interface StoredRow {
  seq: number;
  ts: number;
  type: string;
  room: string;
  engine: string | null;
  source: string;
  event_id: Buffer;
  data: string;
  term: number;
}

/** Rooms a pass may look at for each it may pack. */
const LOOKS_PER_PACK = 8;
/** Rooms seen live or ended lately that a packer remembers to look at again. */
const MAX_PENDING = 50_000;

/**
 * Packs terminal rooms on the leader's writing session, in transactions the caller fences by
 * term. A run walks `rooms` in creation order (`rooms_created_at`) from where the last run left
 * off, up to the first room created after the cut-off; the rooms it met still live or ended too
 * lately it remembers and looks at again in the next runs. A whole run starts the walk again at
 * the oldest room that still has rows, for rooms out of the order of their creation (a clock
 * behind the others) and for what a restart forgot.
 */
export class PgPacker {
  private stored: { shapes: Map<string, number>; suffixes: Map<string, number> } | null = null;
  /** The walk's place: the last room it looked at, by (created_at, room). */
  private floor: { createdAt: number; room: string } | null = null;
  /** Rooms seen that were not ready, by name: looked at again at each run's start. */
  private readonly pending = new Set<string>();
  /** This run's rooms to pack before it walks on. */
  private ready: string[] = [];
  /** Shapes and suffixes this pass's transaction added: kept once it commits (`committed`). */
  private added = { shapes: new Map<string, number>(), suffixes: new Map<string, number>() };

  /**
   * Starts a run, reading through `read` (the pool: the walk is no work of the writing session).
   * `oldest`, for a whole run: the creation time of the oldest room that still has rows
   * (`OLDEST_WITH_ROWS`), where the walk starts again.
   */
  async start(read: Run, cutoffTs: number, oldest?: number | null): Promise<void> {
    if (oldest !== undefined) {
      // Just before the oldest room with rows: every room name sorts after ''.
      this.floor = oldest === null ? null : { createdAt: oldest, room: '' };
    }
    this.ready = [];
    if (this.pending.size === 0) return;
    const seen = (await read('SELECT room, terminal_at FROM rooms WHERE room = ANY(?::text[])', [
      [...this.pending],
    ])) as Array<{ room: string; terminal_at: number | null }>;
    this.pending.clear();
    for (const r of seen) {
      if (r.terminal_at !== null && r.terminal_at < cutoffTs) this.ready.push(r.room);
      else this.pending.add(r.room);
    }
  }

  /**
   * The next `limit` rooms to pack: those the run's start found ready, then the walk's next rooms
   * that still have rows and ended before `cutoffTs` (those live or ended later are remembered).
   * `done`: the walk reached the first room created after the cut-off.
   */
  async next(
    read: Run,
    cutoffTs: number,
    limit: number,
  ): Promise<{ rooms: string[]; done: boolean }> {
    const rooms = this.ready.splice(0, limit);
    let done = true;
    if (rooms.length < limit && this.floor !== null) {
      const looks = (limit - rooms.length) * LOOKS_PER_PACK;
      const walked = (await read(
        `SELECT room, created_at, terminal_at FROM rooms r
          WHERE created_at >= ? AND (created_at > ? OR room > ?) AND created_at < ?
            AND EXISTS (SELECT 1 FROM event_rows e WHERE e.room = r.room)
          ORDER BY created_at, room LIMIT ?`,
        [this.floor.createdAt, this.floor.createdAt, this.floor.room, cutoffTs, looks],
      )) as Array<{ room: string; created_at: number; terminal_at: number | null }>;
      done = walked.length < looks;
      for (const r of walked) {
        if (rooms.length === limit) {
          done = false;
          break;
        }
        this.floor = { createdAt: r.created_at, room: r.room };
        if (r.terminal_at !== null && r.terminal_at < cutoffTs) rooms.push(r.room);
        else if (this.pending.size < MAX_PENDING) this.pending.add(r.room);
      }
    }
    if (this.ready.length > 0) done = false;
    return { rooms, done };
  }

  /**
   * Packs these terminal rooms' rows (a room packed already has none), in the caller's
   * transaction on the writing session.
   */
  async pack(c: pg.ClientBase, rooms: string[]): Promise<PackTotals> {
    const out = { rooms: 0, events: 0, skipped: 0 };
    if (rooms.length === 0) return out;
    const stored = await c.query<StoredRow>(
      `SELECT ${COLUMNS} FROM event_rows WHERE room = ANY($1::text[]) ORDER BY room, seq`,
      [rooms],
    );
    const byRoom = new Map<string, StoredRow[]>();
    for (const r of stored.rows) {
      const list = byRoom.get(r.room);
      if (list) list.push(r);
      else byRoom.set(r.room, [r]);
    }
    const { shapes, suffixes } = await this.tables(c);
    const added = { shapes: new Map<string, number>(), suffixes: new Map<string, number>() };
    this.added = added;
    const idOf = async (
      stored: Map<string, number>,
      fresh: Map<string, number>,
      key: string,
      insert: () => Promise<pg.QueryResult<{ id: number }>>,
    ): Promise<number> => {
      const id = stored.get(key) ?? fresh.get(key);
      if (id !== undefined) return id;
      const made = (await insert()).rows[0]?.id as number;
      fresh.set(key, made);
      return made;
    };
    /** The event's shape, and its data as the pack holds it. */
    const packed = async (r: StoredRow): Promise<{ shape: number; data: string }> => {
      const split = sharedSuffix(r.type, r.data);
      const suffix =
        split === null
          ? null
          : await idOf(suffixes, added.suffixes, `${split.depth} ${split.suffix}`, () =>
              c.query('INSERT INTO event_suffixes (depth, text) VALUES ($1, $2) RETURNING id', [
                split.depth,
                split.suffix,
              ]),
            );
      const head = split === null ? r.data : split.head;
      const laid = layOut(head);
      const shape = [
        r.type,
        r.engine,
        r.source,
        r.event_id[0],
        r.term,
        suffix,
        laid?.layout ?? null,
      ] as const;
      const id = await idOf(shapes, added.shapes, JSON.stringify(shape), () =>
        c.query(
          `INSERT INTO event_shapes (type, engine, source, key_tag, term, suffix, layout)
           VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
          [...shape],
        ),
      );
      return { shape: id, data: laid?.values ?? head };
    };
    const cols: unknown[][] = [[], [], [], [], [], [], []];
    const done: string[] = [];
    for (const [room, rows] of byRoom) {
      if (!rows.every((r) => keyFits(r.event_id) && isJson(r.data))) {
        out.skipped++;
        continue;
      }
      for (const p of packsOf(rows)) {
        const events: string[] = [];
        for (const r of p.rows) {
          const { shape, data } = await packed(r);
          events.push(packedEvent(p, { ...r, data }, shape));
        }
        cols[0]?.push(p.firstSeq);
        cols[1]?.push(room);
        cols[2]?.push(p.lastSeq);
        cols[3]?.push(p.firstTs);
        cols[4]?.push(p.lastTs);
        cols[5]?.push(`[${events.join(',')}]`);
        cols[6]?.push(packKeys(p.rows.map((r) => r.event_id)));
      }
      done.push(room);
      out.rooms++;
      out.events += rows.length;
    }
    if (done.length > 0) {
      await c.query(
        `INSERT INTO room_packs (first_seq, room, last_seq, first_ts, last_ts, events, keys)
         SELECT * FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[],
           $6::json[], $7::bytea[])`,
        cols,
      );
      await c.query('DELETE FROM event_rows WHERE room = ANY($1::text[])', [done]);
    }
    return out;
  }

  /** After the pass's transaction committed: the shapes and suffixes it added are stored. */
  committed(): void {
    for (const [k, id] of this.added.shapes) this.stored?.shapes.set(k, id);
    for (const [k, id] of this.added.suffixes) this.stored?.suffixes.set(k, id);
    this.added = { shapes: new Map(), suffixes: new Map() };
  }

  /** After the pass's transaction rolled back: what it took from the walk is looked at again. */
  rolledBack(): void {
    this.added = { shapes: new Map(), suffixes: new Map() };
    this.floor = null;
  }

  /** Whether the next run must be whole: nothing says yet where its walk goes on. */
  get lost(): boolean {
    return this.floor === null;
  }

  /** `event_shapes` by their columns (as JSON), `event_suffixes` by depth and text: read once. */
  private async tables(c: pg.ClientBase): Promise<NonNullable<PgPacker['stored']>> {
    if (this.stored) return this.stored;
    const shapes = await c.query<{ id: number; shape: string }>(
      'SELECT id, json_build_array(type, engine, source, key_tag, term, suffix, layout)::text AS shape FROM event_shapes',
    );
    const suffixes = await c.query<{ id: number; text: string }>(
      "SELECT id, depth || ' ' || text AS text FROM event_suffixes",
    );
    this.stored = {
      shapes: new Map(shapes.rows.map((r) => [JSON.stringify(JSON.parse(r.shape)), r.id])),
      suffixes: new Map(suffixes.rows.map((r) => [r.text, r.id])),
    };
    return this.stored;
  }
}

function isJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}
