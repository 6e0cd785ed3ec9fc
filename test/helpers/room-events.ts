/**
 * Committed events of one room (`r1`), numbered in order, and the room the real reducer folds from
 * them: the data the control plane's deciders are given in their given/when/then tests.
 */
import type { EventData, EventType, JournalEvent } from '../../src/room/events.ts';
import { type Room, reduce } from '../../src/room/reducer.ts';

let seq = 0;

/** A committed event of room `r1`: its type's data, from `engine`, appended by `source`. */
export function roomEvent<T extends EventType>(
  type: T,
  data: EventData<T>,
  engine: string | null = null,
  source = 'api',
): JournalEvent {
  seq++;
  const envelope = { seq, ts: 1_000 + seq, room: 'r1', engine, source, eventId: `e${seq}` };
  return { ...envelope, type, data } as JournalEvent;
}

/** The room the reducer folds from `events`; throws on one it rejects. */
export function foldRoom(...events: JournalEvent[]): Room {
  let room: Room | null = null;
  for (const e of events) {
    const r = reduce(room, e);
    if (!r.ok) throw new Error(`${e.type}: ${r.reason}`);
    room = r.room;
  }
  return room as Room;
}
