/**
 * One group-commit batch on PostgreSQL. The leader is the only writer, so the batch is planned in
 * memory — reduce, seqs, rejection records — and written with one statement: the events (fenced
 * by term), the rooms it creates and the rooms it changes, atomically, in one round trip. That
 * plan assumes no event id was used before and every room the cache lacks is new; when either is
 * wrong (a retried append, a room from before this leader) the statement fails whole and the batch
 * is planned again knowing the stored ids and rooms, in one transaction of a few statements.
 * Nothing is acknowledged before COMMIT.
 */
import type pg from 'pg';
import { eventKey } from '../../room/event-keys.ts';
import type { PendingEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import {
  type BatchDecision,
  type Decided,
  decideBatch,
  type Outcome,
  type StoredId,
} from '../decide.ts';
import { JournalError } from '../errors.ts';
import type { PackTotals } from '../packs.ts';
import { keptTypes } from '../prune.ts';
import { RELEASED_BY_BOTH } from '../queries.ts';
import { RoomCache } from '../room-cache.ts';
import { ROOM_COLUMNS, type RoomRow, roomToParams, rowToRoom } from '../rows.ts';
import type { CheckpointInput } from '../store.ts';
import { fenced } from './leadership.ts';
import type { PgPacker } from './packs/packer.ts';
import { PACKED_EVENTS } from './packs/sql.ts';

/** Integer columns of `rooms`; the rest are text. */
const ROOM_INT_COLUMNS = new Set([
  'created_at',
  'updated_at',
  'state_since',
  'deadline_at',
  'terminal_at',
  'abort_requested_at',
  'prompt_tokens',
  'max_tokens',
  'kv_pages',
  'transfer_bytes',
  'transfer_micros',
  'tokens',
  'last_seq',
  'event_count',
]);

/** `unnest($from::…[], …)` over the columns of `rooms`, parameters numbered from `from`. */
const roomArrays = (from: number) =>
  `unnest(${ROOM_COLUMNS.map((c, i) => `$${from + i}::${ROOM_INT_COLUMNS.has(c) ? 'bigint' : 'text'}[]`).join(', ')})`;
const ROOM_UPDATES = `ON CONFLICT (room) DO UPDATE SET ${ROOM_COLUMNS.filter((c) => c !== 'room')
  .map((c) => `${c} = excluded.${c}`)
  .join(', ')}`;
const R = ROOM_COLUMNS.length;

const UPSERT_ROOMS = `INSERT INTO rooms (${ROOM_COLUMNS.join(', ')}) SELECT * FROM ${roomArrays(1)} ${ROOM_UPDATES}`;

const EVENT_ROWS = `SELECT u.*, $9::bigint FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[],
    $5::text[], $6::text[], $7::bytea[], $8::text[]) AS u WHERE ${fenced('$9::bigint')}`;
const INSERT_EVENTS = `INSERT INTO event_rows (seq, ts, type, room, engine, source, event_id, data, term) ${EVENT_ROWS}`;

/**
 * The whole batch in one statement. A reused event id or an existing "new" room is a unique
 * violation; a superseded term inserts fewer events than planned, which the final division turns
 * into an error: either way nothing of the statement stays.
 */
const APPEND_AT_ONCE = {
  name: 'pdctl_append_at_once',
  text: `WITH ev AS (
      INSERT INTO event_rows (seq, ts, type, room, engine, source, event_id, data, term) ${EVENT_ROWS}
      RETURNING 1
    ), created AS (
      INSERT INTO rooms (${ROOM_COLUMNS.join(', ')}) SELECT * FROM ${roomArrays(10)} RETURNING 1
    ), changed AS (
      INSERT INTO rooms (${ROOM_COLUMNS.join(', ')}) SELECT * FROM ${roomArrays(10 + R)} ${ROOM_UPDATES}
      RETURNING 1
    )
    SELECT 1 / (CASE WHEN (SELECT count(*) FROM ev) = $${10 + 2 * R}::bigint THEN 1 ELSE 0 END)
      + 0 * ((SELECT count(*) FROM created) + (SELECT count(*) FROM changed)) AS ok`,
};
/** unique_violation, division_by_zero: the plan's assumptions did not hold; plan again. */
const REPLAN = new Set(['23505', '22012']);

const FIND_IDS = `SELECT seq, type, room, source,
    CASE WHEN type = 'room.event_rejected' THEN data::json ->> 'eventType' ELSE type END AS event_type,
    event_id
  FROM event_rows WHERE event_id = ANY($1::bytea[])`;

export class PgBatchWriter {
  private readonly cache: RoomCache<Room>;
  /** The seq of the newest committed event. */
  headSeq: number;

  constructor(
    headSeq: number,
    private readonly term: number,
    roomCacheSize: number,
  ) {
    this.headSeq = headSeq;
    this.cache = new RoomCache(roomCacheSize);
  }

  /** After an outcome that may or may not have committed: relearn what is stored. */
  forget(headSeq: number): void {
    this.headSeq = headSeq;
    this.cache.clear();
  }

  async append(c: pg.ClientBase, batch: PendingEvent[]): Promise<Outcome[]> {
    return (await this.appendAtOnce(c, batch)) ?? this.appendKnowing(c, batch);
  }

  /** The one-statement path; null when its assumptions did not hold (nothing was written). */
  private async appendAtOnce(c: pg.ClientBase, batch: PendingEvent[]): Promise<Outcome[] | null> {
    // Rooms the cache lacks that the batch does not create: read them first (after a takeover).
    const unknown = new Set<string>();
    const creates = new Set<string>();
    for (const ev of batch) {
      if (ev.room === null || !ev.type.startsWith('room.') || this.cache.get(ev.room)) continue;
      if (ev.type === 'room.created' && !unknown.has(ev.room)) creates.add(ev.room);
      else if (!creates.has(ev.room)) unknown.add(ev.room);
    }
    const loaded = await this.loadRooms(c, unknown);
    const plan = this.plan(batch, new Map(), (room) => this.cache.get(room) ?? loaded.get(room));
    const fresh: Room[] = [];
    const known: Room[] = [];
    for (const room of plan.rooms.values()) {
      (this.cache.get(room.room) || loaded.has(room.room) ? known : fresh).push(room);
    }
    try {
      await c.query({
        ...APPEND_AT_ONCE,
        values: [
          ...eventColumns(plan.events),
          this.term,
          ...roomColumns(fresh),
          ...roomColumns(known),
          plan.events.length,
        ],
      });
    } catch (err) {
      if (REPLAN.has((err as { code?: string }).code ?? '')) return null;
      throw err;
    }
    this.headSeq = plan.lastSeq;
    for (const room of plan.rooms.values()) this.cache.set(room.room, room);
    return plan.outcomes;
  }

  private async loadRooms(c: pg.ClientBase, names: Set<string>): Promise<Map<string, Room>> {
    const loaded = new Map<string, Room>();
    if (names.size === 0) return loaded;
    const rows = await c.query<RoomRow>('SELECT * FROM rooms WHERE room = ANY($1::text[])', [
      [...names],
    ]);
    for (const row of rows.rows) loaded.set(row.room as string, rowToRoom(row));
    return loaded;
  }

  /** Planned knowing the stored ids and rooms, in one transaction: retries, rooms from before. */
  private async appendKnowing(c: pg.ClientBase, batch: PendingEvent[]): Promise<Outcome[]> {
    await c.query('BEGIN');
    try {
      const stored = new Map<string, StoredId>();
      const ids = await c.query<{
        seq: number;
        type: string;
        room: string | null;
        source: string;
        event_type: string | null;
        event_id: Buffer;
      }>(FIND_IDS, [batch.map((e) => eventKey(e.eventId, e.source))]);
      for (const r of ids.rows) {
        stored.set(r.event_id.toString('hex'), {
          seq: r.seq,
          storedType: r.type,
          room: r.room,
          source: r.source,
          eventType: r.event_type,
        });
      }
      const missing = new Set<string>();
      for (const ev of batch) {
        if (ev.room !== null && ev.type.startsWith('room.') && !this.cache.get(ev.room)) {
          missing.add(ev.room);
        }
      }
      const loaded = await this.loadRooms(c, missing);
      const plan = this.plan(batch, stored, (room) => this.cache.get(room) ?? loaded.get(room));
      if (plan.events.length > 0) {
        const r = await c.query(INSERT_EVENTS, [...eventColumns(plan.events), this.term]);
        if (r.rowCount !== plan.events.length) {
          throw new JournalError(
            'JOURNAL_FENCED',
            `this control plane no longer leads the journal (its term ${this.term} was superseded); its appends are refused`,
          );
        }
      }
      if (plan.rooms.size > 0) {
        await c.query(UPSERT_ROOMS, roomColumns([...plan.rooms.values()]));
      }
      await c.query('COMMIT');
      this.headSeq = plan.lastSeq;
      for (const room of plan.rooms.values()) this.cache.set(room.room, room);
      return plan.outcomes;
    } catch (err) {
      await c.query('ROLLBACK').catch(() => {});
      throw err;
    }
  }

  /** The batch decided (decide.ts), knowing the stored ids given and the rooms as `current` has them. */
  private plan(
    batch: PendingEvent[],
    /** By the hex of each event's stored key (journal/event-keys.ts). */
    stored: Map<string, StoredId>,
    current: (room: string) => Room | undefined,
  ): BatchDecision {
    return decideBatch(batch, {
      headSeq: this.headSeq,
      stored: (_ev, key) => stored.get(key.toString('hex')),
      room: current,
    });
  }

  /**
   * Deletes up to `chunkRooms` whole terminal rooms that ended before `cutoffTs`, in one
   * transaction fenced by term. Returns the rooms and events deleted.
   */
  async pruneChunk(
    c: pg.ClientBase,
    cutoffTs: number,
    chunkRooms: number,
  ): Promise<{ rooms: number; events: number }> {
    const names = await this.fencedTx(c, async () => {
      const picked = await c.query<{ room: string }>(
        `SELECT room FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < $1
           AND ${RELEASED_BY_BOTH}
         ORDER BY terminal_at LIMIT $2 FOR UPDATE`,
        [cutoffTs, chunkRooms],
      );
      return this.deleteRooms(
        c,
        picked.rows.map((r) => r.room),
      );
    });
    for (const n of names.rooms) this.cache.delete(n);
    return { rooms: names.rooms.length, events: names.events };
  }

  /** Inside a fenced transaction: these terminal rooms (locked) and every event of theirs. */
  private async deleteRooms(
    c: pg.ClientBase,
    rooms: string[],
  ): Promise<{ rooms: string[]; events: number }> {
    if (rooms.length === 0) return { rooms, events: 0 };
    // Their packs go with their rows (trigger room_packs_of_room): count their events first.
    const [packed] = (
      await c.query<{ n: number }>(
        `SELECT coalesce(sum(${PACKED_EVENTS}), 0)::bigint AS n FROM room_packs
          WHERE room = ANY($1::text[])`,
        [rooms],
      )
    ).rows;
    const events =
      (packed?.n ?? 0) +
      ((await c.query('DELETE FROM event_rows WHERE room = ANY($1::text[])', [rooms])).rowCount ??
        0);
    await c.query('DELETE FROM rooms WHERE room = ANY($1::text[]) AND terminal_at IS NOT NULL', [
      rooms,
    ]);
    return { rooms, events };
  }

  /** Deletes up to `limit` events of no room before `cutoffTs` (journal/prune.ts), fenced by term. */
  pruneOthers(c: pg.ClientBase, cutoffTs: number, limit: number): Promise<number> {
    return this.fencedTx(
      c,
      async () =>
        (
          await c.query(
            `DELETE FROM event_rows WHERE seq IN (
               SELECT seq FROM event_rows e WHERE ts < $1 AND type NOT IN (${keptTypes()})
                 AND (room IS NULL OR NOT EXISTS (SELECT 1 FROM rooms r WHERE r.room = e.room))
               ORDER BY ts LIMIT $2)`,
            [cutoffTs, limit],
          )
        ).rowCount ?? 0,
    );
  }

  /** Deletes these rooms and their events, each only if none of its events is newer than `upToSeq`. */
  async pruneNamedRooms(
    c: pg.ClientBase,
    rooms: string[],
    upToSeq: number,
  ): Promise<{ rooms: number; events: number }> {
    const gone = await this.fencedTx(c, async () => {
      const ok = (
        await c.query<{ room: string }>(
          `SELECT room FROM rooms r WHERE room = ANY($1::text[]) AND terminal_at IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM event_rows e WHERE e.room = r.room AND e.seq > $2)
             AND NOT EXISTS (SELECT 1 FROM room_packs p WHERE p.room = r.room AND p.last_seq > $2)
           FOR UPDATE`,
          [rooms, upToSeq],
        )
      ).rows.map((r) => r.room);
      return this.deleteRooms(c, ok);
    });
    for (const n of gone.rooms) this.cache.delete(n);
    return { rooms: gone.rooms.length, events: gone.events };
  }

  /**
   * Deletes these events (retention with an archive: exactly those archived, events of no room,
   * which are never packed), fenced by term.
   */
  pruneSeqs(c: pg.ClientBase, seqs: number[]): Promise<number> {
    return this.fencedTx(
      c,
      async () =>
        (await c.query('DELETE FROM event_rows WHERE seq = ANY($1::bigint[])', [seqs])).rowCount ??
        0,
    );
  }

  /** Packs these rooms (packs/packer.ts), in one transaction fenced by term. */
  async packRooms(c: pg.ClientBase, packer: PgPacker, rooms: string[]): Promise<PackTotals> {
    try {
      const packed = await this.fencedTx(c, async () => {
        // A pack changes what is stored, never what it says: a commit lost to a crash of the
        // server leaves the rows as they were. So it does not wait for the WAL's flush (the next
        // append's commit flushes it).
        await c.query('SET LOCAL synchronous_commit = off');
        return packer.pack(c, rooms);
      });
      packer.committed();
      return packed;
    } catch (err) {
      packer.rolledBack();
      throw err;
    }
  }

  /** `body` in one transaction that commits only while this term leads. */
  private async fencedTx<T>(c: pg.ClientBase, body: () => Promise<T>): Promise<T> {
    await c.query('BEGIN');
    try {
      const fence = await c.query<{ ok: boolean }>(`SELECT ${fenced('$1::bigint')} AS ok`, [
        this.term,
      ]);
      if (fence.rows[0]?.ok !== true) {
        throw new JournalError(
          'JOURNAL_FENCED',
          `this control plane no longer leads the journal (term ${this.term} was superseded)`,
        );
      }
      const result = await body();
      await c.query('COMMIT');
      return result;
    } catch (err) {
      await c.query('ROLLBACK').catch(() => {});
      throw err;
    }
  }

  /** Upserts a consumer cursor, fenced by term. */
  async setCursor(c: pg.ClientBase, name: string, seq: number, ts: number): Promise<void> {
    const r = await c.query(
      `INSERT INTO consumers (name, seq, updated_at) SELECT $1, $2, $3 WHERE ${fenced('$4::bigint')}
       ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, updated_at = excluded.updated_at`,
      [name, seq, ts, this.term],
    );
    this.checkFenced(r.rowCount);
  }

  /** Replaces a state checkpoint, stamped with the schema it is written under; fenced by term. */
  async setCheckpoint(c: pg.ClientBase, cp: CheckpointInput, ts: number): Promise<void> {
    const r = await c.query(
      `INSERT INTO state_checkpoints (name, seq, format, schema_version, written_at, digest, data)
       SELECT $1, $2, $3, (SELECT max(version) FROM schema_migrations), $4, $5, $6
        WHERE ${fenced('$7::bigint')}
       ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, format = excluded.format,
         schema_version = excluded.schema_version, written_at = excluded.written_at,
         digest = excluded.digest, data = excluded.data`,
      [cp.name, cp.seq, cp.format, ts, cp.digest, cp.data, this.term],
    );
    this.checkFenced(r.rowCount);
  }

  private checkFenced(rowCount: number | null): void {
    if (rowCount !== 1) {
      throw new JournalError(
        'JOURNAL_FENCED',
        `this control plane no longer leads the journal (term ${this.term} was superseded)`,
      );
    }
  }
}

/** The events as eight column arrays (seq … data), as the unnest of INSERT_EVENTS takes them. */
function eventColumns(events: Decided[]): unknown[][] {
  const cols: unknown[][] = [[], [], [], [], [], [], [], []];
  for (const e of events) {
    cols[0]?.push(e.seq);
    cols[1]?.push(e.ts);
    cols[2]?.push(e.type);
    cols[3]?.push(e.room);
    cols[4]?.push(e.engine);
    cols[5]?.push(e.source);
    cols[6]?.push(e.key);
    cols[7]?.push(JSON.stringify(e.data));
  }
  return cols;
}

/** Rooms as one array per column of `rooms`, in ROOM_COLUMNS order. */
function roomColumns(rooms: Room[]): unknown[][] {
  const cols: unknown[][] = ROOM_COLUMNS.map(() => []);
  for (const room of rooms) {
    roomToParams(room).forEach((v, i) => {
      cols[i]?.push(v);
    });
  }
  return cols;
}
