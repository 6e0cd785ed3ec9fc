/**
 * The journal's one decision per batch, written once for every backend (emmett's decide over a
 * small event store is the model): given a batch of validated events, what is stored under each
 * event's id and each room as the journal holds it, it says what each event becomes — applied
 * (its seq, its room's new state), rejected (a `room.event_rejected` record in its place), a
 * duplicate of the event stored under its id, or in conflict with it (nothing written) — and the
 * events and rooms to persist. It is pure: a backend looks things up before and persists what it
 * says after, all of it in one transaction or none.
 */
import { eventKey } from '../room/event-keys.ts';
import type { PendingEvent } from '../room/events.ts';
import { type Room, reduce } from '../room/reducer.ts';

/**
 * Outcome per event, compact for the trip back from a writer thread:
 * [0, seq, state] applied · [1, seq, reason, state, detail] rejected · [2, seq, originalRejected] duplicate ·
 * [3, seq of the original, detail] the event id is taken by a different event (nothing written)
 */
export type Outcome =
  | [0, number, string | null]
  | [1, number, string, string | null, string]
  | [2, number, boolean]
  | [3, number, string];

/** The data of the `room.event_rejected` record written in place of an event that does not fit. */
export function rejectionData(
  ev: Pick<PendingEvent, 'type' | 'data'>,
  reason: string,
  state: string | null,
): { eventType: string; reason: string; state: string | null; data: unknown } {
  return { eventType: ev.type, reason, state, data: ev.data };
}

/** An event already stored under an id, as the duplicate check needs it. */
export interface StoredId {
  seq: number;
  /** Its type, or `room.event_rejected` for a rejection record. */
  storedType: string;
  room: string | null;
  source: string;
  /** The type of the event it stands for (a rejection record: the refused event's type). */
  eventType: string | null;
}

/**
 * Why `ev` cannot be the event stored under its id, or null when it is that event sent again (a
 * retry: a duplicate). An id can never make a different event — another source's, another
 * room's — count as already done.
 */
export function idConflict(ev: PendingEvent, stored: StoredId): string | null {
  const { seq, storedType, room, source, eventType } = stored;
  if (eventType === ev.type && room === ev.room && source === ev.source) return null;
  return `event id ${ev.eventId} is taken by seq ${seq} (${eventType ?? storedType} from ${source}${room ? ` for ${room}` : ''}); this ${ev.type} from ${ev.source} is not that event`;
}

/** What the decision is given: the journal as it is before the batch. */
export interface BatchGiven {
  /** The last seq given out (seqs are never reused, even after retention). */
  headSeq: number;
  /** The event stored under `ev`'s id, whose stored key is `key` (journal/event-keys.ts), if any. */
  stored(ev: PendingEvent, key: Buffer): StoredId | undefined;
  /** A room as the journal holds it; undefined or null when it has none by that name. */
  room(name: string): Room | null | undefined;
}

/** An event to store: an applied one, or a rejected one's record in its place, with its id's key. */
export type Decided = PendingEvent & {
  seq: number;
  /** The stored key of its id (journal/event-keys.ts), made once here. */
  key: Buffer;
  /** The type of the event it stands for (a rejection record's: the refused event's). */
  eventType: string;
};

/** What to persist, and what each event became. */
export interface BatchDecision {
  /** One per event of the batch, in its order. */
  outcomes: Outcome[];
  /** The events to store, in seq order. */
  events: Decided[];
  /** The rooms the batch changed, as they are after it (each with its `lastSeq`). */
  rooms: Map<string, Room>;
  /** The last seq the batch gave out (`headSeq` when it stored nothing). */
  lastSeq: number;
}

/** Decides a batch: see the module's comment. */
export function decideBatch(batch: readonly PendingEvent[], given: BatchGiven): BatchDecision {
  const outcomes: Outcome[] = new Array(batch.length);
  const events: Decided[] = [];
  const rooms = new Map<string, Room>();
  /** Events stored earlier in this batch, by their key (latin1): their index in `events`. */
  const mine = new Map<string, number>();
  let seq = given.headSeq;
  for (let i = 0; i < batch.length; i++) {
    const ev = batch[i] as PendingEvent;
    const key = eventKey(ev.eventId, ev.source);
    const text = key.toString('latin1');
    const earlier = mine.get(text);
    const taken = earlier === undefined ? given.stored(ev, key) : storedIdOf(events[earlier]);
    if (taken) {
      const conflict = idConflict(ev, taken);
      outcomes[i] =
        conflict === null
          ? [2, taken.seq, taken.storedType === 'room.event_rejected']
          : [3, taken.seq, conflict];
      continue;
    }
    seq++;
    let type: string = ev.type;
    let data: unknown = ev.data;
    if (ev.room === null || !ev.type.startsWith('room.')) {
      outcomes[i] = [0, seq, null];
    } else {
      const before = rooms.get(ev.room) ?? given.room(ev.room) ?? null;
      const result = reduce(before, { ...ev, seq: 0 });
      if (result.ok) {
        result.room.lastSeq = seq; // the reducer returned a fresh object; seq is known only now
        rooms.set(ev.room, result.room);
        outcomes[i] = [0, seq, result.room.state];
      } else {
        type = 'room.event_rejected';
        data = rejectionData(ev, result.reason, result.state);
        outcomes[i] = [1, seq, result.reason, result.state, result.detail];
      }
    }
    mine.set(text, events.length);
    // One shape for every event (the order of a stored event's fields, as every backend keeps it).
    events.push({
      ts: ev.ts,
      type,
      room: ev.room,
      engine: ev.engine,
      source: ev.source,
      eventId: ev.eventId,
      data,
      seq,
      key,
      eventType: ev.type,
    } as Decided);
  }
  return { outcomes, events, rooms, lastSeq: seq };
}

/** An event stored earlier in the batch, as the duplicate check needs it. */
function storedIdOf(stored: Decided | undefined): StoredId | undefined {
  if (!stored) return undefined;
  const { seq, type, room, source, eventType } = stored;
  return { seq, storedType: type, room, source, eventType };
}
