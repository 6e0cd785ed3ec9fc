/**
 * What comes after packing — a retried append, a late event, retention — as both backends' packs
 * tests check it (src/journal/{sqlite,postgres}/packs/packs.int.test.ts); each adds what only its
 * storage can show.
 */
import { expect } from 'vitest';
import type { PackTotals } from '../../src/journal/packs.ts';
import type { AppendResult, JournalStore } from '../../src/journal/store.ts';
import type { EventInput } from '../../src/room/events.ts';
import { lifecycle } from './events.ts';
import { END } from './pack-reads.ts';

/** A journal that packs: SqliteJournal or PgJournal. */
export type PackingJournal = JournalStore & { pack(cutoffTs: number): Promise<PackTotals> };

/**
 * A room packed, then a retry of its first append (refused as late: a packed event's id is no
 * longer looked up) and a late event (a row of the room, or refused): the timeline reads the
 * packed events, their ids as they were, then the two. `packed`: checks after the pack.
 */
export async function appendsAfterPacking(
  j: PackingJournal,
  packed: () => void | Promise<void> = () => {},
): Promise<void> {
  const room = 'late-room';
  const events = lifecycle(room).map((ev, i) => ({ ...ev, ts: END - 60_000 + i }));
  const results: AppendResult[] = [];
  for (const ev of events) results.push(await j.append(ev));
  await j.pack(END);
  await packed();
  const retry = await j.append({ ...(events[0] as EventInput), eventId: results[0]?.eventId });
  expect(retry.status).toBe('rejected');
  const late = await j.append({
    type: 'room.released',
    room,
    engine: 'd0',
    source: 'd0',
    ts: END,
    data: { pages: 4 },
  });
  expect(['applied', 'rejected']).toContain(late.status);
  const timeline = await j.timeline(room);
  expect(timeline.events.map((e) => e.room)).toEqual(timeline.events.map(() => room));
  expect(timeline.events.slice(0, events.length).map((e) => e.eventId)).toEqual(
    results.map((r) => r.eventId),
  );
  expect(timeline.events.length).toBe(events.length + 2);
  expect((await j.verify()).problems).toEqual([]);
}

/**
 * Retention after packing counts and prunes what it would have on rows, and leaves no pack
 * without its room (`orphans`) while packs of rooms it kept remain (`packs`).
 */
export async function pruneAfterPacking(
  j: PackingJournal,
  o: { orphans: () => Promise<number> | number; packs: () => Promise<number> | number },
): Promise<void> {
  const cutoff = END - 5 * 60_000;
  const expected = await j.countPrunable(cutoff, cutoff);
  await j.pack(END);
  expect(await j.countPrunable(cutoff, cutoff)).toEqual(expected);
  const pruned = await j.prune({ cutoffTs: cutoff, eventsCutoffTs: cutoff, chunkRooms: 37 });
  expect({ rooms: pruned.rooms, events: pruned.events, otherEvents: pruned.otherEvents }).toEqual(
    expected,
  );
  expect(await o.orphans()).toBe(0);
  expect(await o.packs()).toBeGreaterThan(0);
  expect((await j.verify()).problems).toEqual([]);
}
