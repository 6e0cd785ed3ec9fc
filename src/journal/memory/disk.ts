/**
 * What an in-memory journal keeps as if on disk (issue 41): the committed events, the rooms
 * projection, the consumer cursors, the state checkpoints and who holds the writer. It outlives the `MemoryJournal` that
 * writes it — a journal closed, crashed or drained and opened again finds exactly what committed
 * — and it changes only when a commit applies, all of a batch at once, as a transaction does.
 */

import { eventKey } from '../../room/event-keys.ts';
import type { JournalEvent, PendingEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import { decideBatch, type Outcome } from '../decide.ts';
import { KEPT_TYPES } from '../prune.ts';
import { releasedByBoth } from '../queries.ts';
import type { StoredCheckpoint } from '../store.ts';
import { MemoryLeadership } from './leadership.ts';

const KEPT = new Set<string>(KEPT_TYPES);

/** The key an event's id is stored under (journal/event-keys.ts), as a string for a Map. */
function keyOf(ev: { eventId: string; source: string }): string {
  return eventKey(ev.eventId, ev.source).toString('latin1');
}

export class MemoryDisk {
  /** Committed events in seq order (retention deletes whole rooms' events from it). */
  readonly events: JournalEvent[] = [];
  /** Events by their id's stored key, so that ids are one another's duplicates exactly as in SQLite and PostgreSQL. */
  private readonly byEventId = new Map<string, JournalEvent>();
  readonly rooms = new Map<string, Room>();
  readonly consumers = new Map<string, { seq: number; updatedAt: number }>();
  readonly checkpoints = new Map<
    string,
    Omit<StoredCheckpoint, 'currentSchemaVersion' | 'brokenBy'>
  >();
  /** The last seq given out: seqs are never reused, even after retention. */
  lastSeq = 0;
  /** The journal that writes it now, if any (one writer at a time, as with a file's lock). */
  writer: object | null = null;
  /** Who leads it, where control planes take turns on it as on PostgreSQL (leadership.ts). */
  readonly leadership = new MemoryLeadership();

  /** A name for messages and `stats().path`. */
  constructor(readonly name: string) {}

  /**
   * Applies a batch as one transaction: the journal's decision (decide.ts), then everything it
   * says at once. Nothing of it is visible until all of it is.
   */
  commit(batch: PendingEvent[]): Outcome[] {
    const decided = decideBatch(batch, {
      headSeq: this.lastSeq,
      stored: (_ev, key) => {
        const held = this.byEventId.get(key.toString('latin1'));
        if (!held) return undefined;
        const rejected = held.type === 'room.event_rejected';
        const eventType = rejected ? (held.data as { eventType: string }).eventType : held.type;
        return {
          seq: held.seq,
          storedType: held.type,
          room: held.room,
          source: held.source,
          eventType,
        };
      },
      room: (name) => this.rooms.get(name),
    });
    for (const { key: _key, eventType: _type, ...ev } of decided.events)
      this.add({ ...ev, data: copy(ev.data) } as JournalEvent);
    for (const [name, room] of decided.rooms) this.rooms.set(name, room);
    this.lastSeq = decided.lastSeq;
    return decided.outcomes;
  }

  /** Committed events with seq > afterSeq, oldest first, at most `limit`. */
  readFrom(afterSeq: number, limit: number): JournalEvent[] {
    const from = this.indexAfter(afterSeq);
    return this.events.slice(from, from + limit).map(copyEvent);
  }

  /** The index of the first event with seq > afterSeq. */
  indexAfter(afterSeq: number): number {
    let lo = 0;
    let hi = this.events.length;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if ((this.events[mid] as JournalEvent).seq <= afterSeq) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  }

  /** The newest committed seq still held (0 when none is). */
  headSeq(): number {
    return this.events.at(-1)?.seq ?? 0;
  }

  /** Terminal rooms that ended before the cut-off, the oldest first (retention's order). */
  prunable(cutoffTs: number): Room[] {
    return [...this.rooms.values()]
      .filter((r) => r.terminalAt !== null && r.terminalAt < cutoffTs && releasedByBoth(r))
      .sort((a, b) => (a.terminalAt as number) - (b.terminalAt as number));
  }

  /** Up to `limit` prunable rooms with all their events, as copies: a chunk to archive. */
  pickRooms(cutoffTs: number, limit: number): { rooms: Room[]; events: JournalEvent[] } {
    const rooms = this.prunable(cutoffTs).slice(0, limit).map(copyRoom);
    const names = new Set(rooms.map((r) => r.room));
    const events = this.events.filter((e) => e.room !== null && names.has(e.room));
    return { rooms, events: events.map(copyEvent) };
  }

  /** Up to `limit` events of no room before `cutoffTs`, as copies: a chunk to archive. */
  pickOthers(cutoffTs: number, limit: number): JournalEvent[] {
    return this.events
      .filter((e) => this.isOther(e, cutoffTs))
      .slice(0, limit)
      .map(copyEvent);
  }

  /**
   * Deletes these rooms and their events, each only if none of its events is newer than
   * `upToSeq` (archived rooms: one that changed since was not archived whole).
   */
  deleteRoomsUpTo(names: readonly string[], upToSeq: number): { rooms: number; events: number } {
    const newer = new Set(
      this.events.filter((e) => e.seq > upToSeq && e.room !== null).map((e) => e.room),
    );
    const gone = names.filter((n) => !newer.has(n));
    return { rooms: gone.length, events: this.deleteRooms(gone) };
  }

  /** Deletes whole rooms and their events (retention); returns the events deleted. */
  deleteRooms(names: readonly string[]): number {
    const gone = new Set(names);
    for (const name of names) this.rooms.delete(name);
    return this.deleteEvents((ev) => ev.room !== null && gone.has(ev.room));
  }

  /** Deletes up to `limit` events of no room before `cutoffTs` (retention); returns how many. */
  deleteOthers(cutoffTs: number, limit: number): number {
    let left = limit;
    return this.deleteEvents((ev) => left > 0 && this.isOther(ev, cutoffTs) && left-- > 0);
  }

  /** Deletes these events (retention with an archive); returns how many. */
  deleteSeqs(seqs: readonly number[]): number {
    const gone = new Set(seqs);
    return this.deleteEvents((ev) => gone.has(ev.seq));
  }

  /** Takes a committed event (its seq after every other's): what commit does, and an archive's load. */
  add(ev: JournalEvent): void {
    this.events.push(ev);
    this.byEventId.set(keyOf(ev), ev);
  }

  /** An event of no room in `rooms` before `cutoffTs`, not of the KEPT_TYPES (journal/prune.ts). */
  isOther(ev: JournalEvent, cutoffTs: number): boolean {
    return ev.ts < cutoffTs && !KEPT.has(ev.type) && (ev.room === null || !this.rooms.has(ev.room));
  }

  private deleteEvents(gone: (ev: JournalEvent) => boolean): number {
    let deleted = 0;
    let kept = 0;
    for (const ev of this.events) {
      if (gone(ev)) {
        deleted++;
        this.byEventId.delete(keyOf(ev));
      } else this.events[kept++] = ev;
    }
    this.events.length = kept;
    return deleted;
  }
}

/** What a reader gets is its own, as a row read from a database is: never the stored object. */
export function copyEvent(ev: JournalEvent): JournalEvent {
  return { ...ev, data: copy(ev.data) } as JournalEvent;
}

export function copyRoom(room: Room): Room {
  return { ...room, releasedBy: [...room.releasedBy], deadlinesMs: { ...room.deadlinesMs } };
}

function copy<T>(data: T): T {
  return JSON.parse(JSON.stringify(data)) as T;
}
