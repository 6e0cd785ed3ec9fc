/**
 * The synchronous heart of the writer: applies a batch of validated events in one
 * `BEGIN IMMEDIATE` transaction — reduce, insert, project — and commits. Runs on the writer
 * thread (writer-thread.ts); nothing here is awaited, and nothing leaves before COMMIT.
 */
import type Database from 'better-sqlite3';
import type { PendingEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import { decideBatch, type Outcome, type StoredId } from '../decide.ts';
import { RELEASED_BY_BOTH } from '../queries.ts';
import { RoomCache } from '../room-cache.ts';
import {
  MUTABLE_ROOM_FIELDS,
  ROOM_COLUMNS,
  type RoomRow,
  roomToParams,
  rowToRoom,
} from '../rows.ts';
import type { CheckpointInput } from '../store.ts';
import { EVENT_SELECT, IdTable, OTHER_EVENTS, storedData } from './event-rows.ts';
import { Packer, type PackPass } from './packs/packer.ts';
import { PACKED_EVENTS } from './packs/sql.ts';

/**
 * A room as the writer holds it: the projection, its row id (null until inserted), the version its
 * row holds, so an update writes only the columns that changed, and its id in `event_rooms`.
 */
interface Held {
  room: Room;
  id: number | null;
  stored: Room | null;
  key: number | undefined;
}

export class BatchWriter {
  private readonly cache: RoomCache<Held>;
  private readonly insertEvent: Database.Statement;
  /** The last seq given out (AUTOINCREMENT's; seqs are never reused, even after retention). */
  private readonly lastSeq: Database.Statement;
  private readonly findEvent: Database.Statement;
  /** Types, sources and engines (`event_names`), and the shared parts of data (`event_shared`). */
  private readonly names: IdTable;
  private readonly shared: IdTable;
  private readonly findRoomKey: Database.Statement;
  private readonly insertRoomKey: Database.Statement;
  private readonly loadRoom: Database.Statement;
  private readonly insertRoom: Database.Statement;
  /** UPDATE statements by the set of columns they change (a bit per MUTABLE_ROOM_FIELDS entry). */
  private readonly updates = new Map<number, Database.Statement>();
  private readonly upsertCursor: Database.Statement;
  private readonly applyTx: (batch: PendingEvent[], knowing: boolean) => Outcome[];
  private pruning: ReturnType<BatchWriter['preparePrune']> | undefined;
  private packer: Packer | undefined;

  constructor(
    private readonly db: Database.Database,
    options: { roomCacheSize?: number } = {},
  ) {
    this.cache = new RoomCache(options.roomCacheSize ?? 50_000);
    this.insertEvent = db.prepare(
      `INSERT INTO event_rows (seq, ts, type, room, engine, source, event_id, data, shared)
       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING`,
    );
    this.lastSeq = db.prepare("SELECT seq FROM sqlite_sequence WHERE name = 'event_rows'").pluck();
    this.names = IdTable.of(db, 'event_names', 'name');
    this.shared = IdTable.of(db, 'event_shared', 'json');
    this.findRoomKey = db.prepare('SELECT id FROM event_rooms WHERE room = ?').pluck();
    this.insertRoomKey = db.prepare('INSERT INTO event_rooms (room) VALUES (?)');
    // A rejection record stands for the event it refused: compare with that event's type.
    this.findEvent = db
      .prepare(
        `SELECT seq, type, room, source,
           CASE WHEN type = 'room.event_rejected' THEN json_extract(data, '$.eventType') ELSE type END
         FROM (${EVENT_SELECT} WHERE e.event_id = ?)`,
      )
      .raw();
    this.loadRoom = db.prepare('SELECT * FROM rooms WHERE room = ?');
    this.insertRoom = db.prepare(
      `INSERT INTO rooms (${ROOM_COLUMNS.join(', ')}) VALUES (${ROOM_COLUMNS.map(() => '?').join(', ')})`,
    );
    this.upsertCursor = db.prepare(
      `INSERT INTO consumers (name, seq, updated_at) VALUES (?, ?, ?)
       ON CONFLICT (name) DO UPDATE SET seq = excluded.seq, updated_at = excluded.updated_at`,
    );
    const tx = db.transaction((batch: PendingEvent[], knowing: boolean) =>
      this.applyInTx(batch, knowing),
    );
    this.applyTx = (batch, knowing) => tx.immediate(batch, knowing);
  }

  /**
   * Appends a batch atomically: the journal's decision (decide.ts), persisted in one transaction.
   * It is decided first as if no id of the batch were stored (the insert itself finds out); if
   * one is (a retry), that transaction is rolled back and the batch decided again knowing every
   * stored id. The room cache is updated only after COMMIT, so a failed transaction leaves it
   * exactly as the database is.
   */
  append(batch: PendingEvent[]): Outcome[] {
    try {
      let outcomes: Outcome[];
      try {
        outcomes = this.applyTx(batch, false);
      } catch (err) {
        if (!(err instanceof IdStored)) throw err;
        this.forgetAttempt();
        outcomes = this.applyTx(batch, true);
      }
      for (const held of this.overlay.values()) {
        held.stored = held.room;
        this.cache.set(held.room.room, held);
      }
      this.names.commit();
      this.shared.commit();
      return outcomes;
    } finally {
      this.forgetAttempt();
    }
  }

  /** What a transaction that did not commit left in memory: its rooms, its new names. */
  private forgetAttempt(): void {
    this.overlay = new Map();
    this.names.rollback();
    this.shared.rollback();
  }

  /** Rooms changed by the batch being applied; merged into the cache only after COMMIT. */
  private overlay = new Map<string, Held>();

  /** The room as the writer holds it in memory (this batch's overlay, then the cache), if it does. */
  private held(room: string): Held | null {
    return this.overlay.get(room) ?? this.cache.get(room) ?? null;
  }

  private current(room: string): Held | null {
    const held = this.held(room);
    if (held) return held;
    const row = this.loadRoom.get(room) as (RoomRow & { id: number }) | undefined;
    if (!row) return null;
    const loaded = rowToRoom(row);
    return { room: loaded, id: row.id, stored: loaded, key: undefined };
  }

  /** What is stored under an event's id key, as the decision needs it. */
  private storedId(key: Buffer): StoredId | undefined {
    const row = this.findEvent.get(key) as
      | [number, string, string | null, string, string | null]
      | undefined;
    if (!row) return undefined;
    const [seq, storedType, room, source, eventType] = row;
    return { seq, storedType, room, source, eventType };
  }

  private applyInTx(batch: PendingEvent[], knowing: boolean): Outcome[] {
    /** The rooms the decision asked for, as the writer holds them (null: none by that name). */
    const looked = new Map<string, Held | null>();
    const decided = decideBatch(batch, {
      headSeq: (this.lastSeq.get() as number | undefined) ?? 0,
      stored: knowing ? (_ev, key) => this.storedId(key) : () => undefined,
      room: (name) => {
        const held = this.current(name);
        looked.set(name, held);
        return held?.room;
      },
    });
    /** Each room's id in `event_rooms`, found or made by this batch. */
    const keys = new Map<string, number>();
    for (const ev of decided.events) {
      let roomKey: number | null = null;
      if (ev.room !== null) {
        roomKey =
          keys.get(ev.room) ??
          looked.get(ev.room)?.key ??
          this.held(ev.room)?.key ??
          (this.findRoomKey.get(ev.room) as number | undefined) ??
          Number(this.insertRoomKey.run(ev.room).lastInsertRowid);
        keys.set(ev.room, roomKey);
      }
      const stored = storedData(ev.type, ev.data);
      const info = this.insertEvent.run(
        ev.seq,
        ev.ts,
        this.names.id(ev.type),
        roomKey,
        ev.engine === null ? null : this.names.id(ev.engine),
        this.names.id(ev.source),
        ev.key,
        stored.data,
        stored.shared === null ? null : this.shared.id(stored.shared),
      );
      // Its id was stored before: roll back, and decide again knowing (see `append`).
      if (info.changes === 0) throw new IdStored();
    }
    for (const room of decided.rooms.values()) {
      const before = looked.get(room.room) ?? null;
      const held: Held = {
        room,
        id: before?.id ?? null,
        stored: before?.stored ?? null,
        key: keys.get(room.room) ?? before?.key,
      };
      if (held.id === null || held.stored === null) {
        held.id = Number(this.insertRoom.run(roomToParams(room)).lastInsertRowid);
      } else {
        this.writeChanges(held.id, held.stored, room);
      }
      this.overlay.set(room.room, held);
    }
    return decided.outcomes;
  }

  /** Writes only the columns that differ between the stored row and the new projection. */
  private writeChanges(id: number, stored: Room, room: Room): void {
    let mask = 0;
    const params: unknown[] = [];
    for (let i = 0; i < MUTABLE_ROOM_FIELDS.length; i++) {
      const [, get, json] = MUTABLE_ROOM_FIELDS[i] as (typeof MUTABLE_ROOM_FIELDS)[number];
      const value = get(room);
      if (value === get(stored)) continue;
      mask |= 1 << i;
      params.push(json ? JSON.stringify(value) : value);
    }
    if (mask === 0) return;
    let stmt = this.updates.get(mask);
    if (!stmt) {
      const sets = MUTABLE_ROOM_FIELDS.filter((_, i) => mask & (1 << i)).map(([c]) => `${c} = ?`);
      stmt = this.db.prepare(`UPDATE rooms SET ${sets.join(', ')} WHERE id = ?`);
      this.updates.set(mask, stmt);
    }
    params.push(id);
    stmt.run(params);
  }

  setCursor(name: string, seq: number, ts: number): void {
    this.upsertCursor.run(name, seq, ts);
  }

  /** Replaces a state checkpoint, stamped with the schema it is written under. */
  setCheckpoint(c: CheckpointInput, ts: number): void {
    this.db
      .prepare(
        `INSERT OR REPLACE INTO state_checkpoints
           (name, seq, format, schema_version, written_at, digest, data)
         VALUES (?, ?, ?, (SELECT max(version) FROM schema_migrations), ?, ?, ?)`,
      )
      .run(c.name, c.seq, c.format, ts, c.digest, c.data);
  }

  /**
   * Deletes up to `limit` whole terminal rooms that ended before `cutoffTs`, in one short
   * transaction (retention runs chunk after chunk, appends in between: journal/prune.ts).
   */
  pruneRooms(cutoffTs: number, limit: number): { rooms: number; events: number } {
    this.pruning ??= this.preparePrune();
    const { pick } = this.pruning;
    return this.db
      .transaction(() => this.deleteRooms(pick.pluck().all(cutoffTs, limit) as string[], null))
      .immediate();
  }

  /** Deletes these rooms and their events, each only if none of its events is newer than `upToSeq`. */
  pruneNamedRooms(rooms: readonly string[], upToSeq: number): { rooms: number; events: number } {
    return this.db.transaction(() => this.deleteRooms(rooms, upToSeq)).immediate();
  }

  /** Inside a transaction: terminal rooms with every event of theirs (none newer than `upToSeq`). */
  private deleteRooms(
    rooms: readonly string[],
    upToSeq: number | null,
  ): { rooms: number; events: number } {
    this.pruning ??= this.preparePrune();
    const { newer, delEvents, packedEvents, delRoom } = this.pruning;
    let deleted = 0;
    let events = 0;
    for (const room of rooms) {
      if (upToSeq !== null && newer.get(room, upToSeq) !== undefined) continue;
      // Its packs go with its row (trigger room_packs_of_room): count their events first.
      events += (packedEvents.get(room) as number) + delEvents.run(room).changes;
      deleted += delRoom.run(room).changes;
      this.cache.delete(room);
    }
    return { rooms: deleted, events };
  }

  /** Packs rooms that ended before `cutoffTs`, looking at up to `limit` after `afterKey` (packs/packer.ts). */
  packRooms(cutoffTs: number, limit: number, afterKey: number, whole: boolean): PackPass {
    // A packed room's `event_rooms` id is gone: the cache must not hand it out again.
    this.packer ??= new Packer(this.db, (room) => this.cache.delete(room));
    return this.packer.pass(cutoffTs, limit, afterKey, whole);
  }

  /** Deletes these events (retention with an archive: exactly those archived). */
  pruneSeqs(seqs: readonly number[]): number {
    this.pruning ??= this.preparePrune();
    const { delSeq } = this.pruning;
    return this.db
      .transaction(() => seqs.reduce((n, seq) => n + delSeq.run(seq).changes, 0))
      .immediate();
  }

  /** Deletes up to `limit` events of no room before `cutoffTs`, KEPT_TYPES excepted. */
  pruneEvents(cutoffTs: number, limit: number): number {
    this.pruning ??= this.preparePrune();
    const { delOthers } = this.pruning;
    return this.db.transaction(() => delOthers.run(cutoffTs, limit).changes).immediate();
  }

  private preparePrune() {
    return {
      pick: this.db.prepare(
        `SELECT room FROM rooms WHERE terminal_at IS NOT NULL AND terminal_at < ?
           AND ${RELEASED_BY_BOTH}
         ORDER BY terminal_at LIMIT ?`,
      ),
      // A room's last event takes its `event_rooms` id with it (trigger event_rooms_unused).
      delEvents: this.db.prepare(
        'DELETE FROM event_rows WHERE room = (SELECT id FROM event_rooms WHERE room = ?)',
      ),
      packedEvents: this.db
        .prepare(
          `SELECT coalesce(sum(${PACKED_EVENTS}), 0) FROM room_packs
            WHERE room = (SELECT id FROM rooms WHERE room = ? AND terminal_at IS NOT NULL)`,
        )
        .pluck(),
      delRoom: this.db.prepare('DELETE FROM rooms WHERE room = ? AND terminal_at IS NOT NULL'),
      newer: this.db.prepare(
        `SELECT 1 FROM event_rows WHERE room = (SELECT id FROM event_rooms WHERE room = ?)
           AND seq > ? LIMIT 1`,
      ),
      delSeq: this.db.prepare('DELETE FROM event_rows WHERE seq = ?'),
      // Rejection records of rooms that never existed have a room but no row: they go too.
      delOthers: this.db.prepare(
        `DELETE FROM event_rows WHERE seq IN (SELECT seq FROM (${OTHER_EVENTS}) ORDER BY ts LIMIT ?)`,
      ),
    };
  }
}

/** Thrown inside the transaction when an event's id turns out to be stored: it rolls back. */
class IdStored extends Error {}
