import { describe, expect, it } from 'vitest';
import { lifecycle } from '../../test/helpers/events.ts';
import { MemoryDisk } from '../journal/memory/disk.ts';
import type { JournalEvent } from '../room/events.ts';
import { liveness, safety } from './invariants.ts';
import { MemoryJournal } from './world/journal.ts';

/** Committed events of whole rooms, through a real journal (the reducer has passed on each). */
async function committed(rooms: string[]) {
  const disk = new MemoryDisk('invariants');
  const journal = MemoryJournal.open({ disk });
  for (const room of rooms) for (const ev of lifecycle(room, 'p0', 'd0')) await journal.append(ev);
  await journal.drain();
  const stateOf = (room: string) => disk.rooms.get(room)?.state;
  return { events: disk.events.map((e) => ({ ...e })) as JournalEvent[], stateOf };
}

/** The events with `ev` put in at `index`, seqs renumbered in order. */
function splice(events: JournalEvent[], index: number, ev: Partial<JournalEvent>) {
  const out = [...events];
  out.splice(index, 0, { ...(events[index - 1] as JournalEvent), ...ev } as JournalEvent);
  return out.map((e, i) => ({ ...e, seq: i + 1 }) as JournalEvent);
}

const names = (vs: Array<{ invariant: string }>) => vs.map((v) => v.invariant);

describe('the journal invariants', () => {
  it('hold for rooms a real journal committed from start to release', async () => {
    const { events, stateOf } = await committed(['a', 'b', 'c']);
    expect(events.length).toBeGreaterThan(20);
    expect(safety(events)).toEqual([]);
    expect(liveness(events, stateOf)).toEqual([]);
  });

  it('name what breaks safety, with the seq and room', async () => {
    const { events } = await committed(['a']);
    const end = events.findIndex((e) => e.type === 'room.completed');
    const twice = splice(events, end + 1, { type: 'room.completed' } as Partial<JournalEvent>);
    expect(safety(twice)).toEqual([
      expect.objectContaining({ invariant: 'nothing_after_end', room: 'a', seq: end + 2 }),
    ]);
    const released = events.findIndex((e) => e.type === 'room.released');
    const again = splice(events, released + 1, events[released] as JournalEvent);
    expect(names(safety(again))).toEqual(['release_once']);
    const stranger = splice(events, released + 1, {
      ...(events[released] as JournalEvent),
      engine: 'p9',
    });
    expect(names(safety(stranger))).toEqual(['release_by_pair']);
    const recreated = splice(events, 1, events[0] as JournalEvent);
    expect(names(safety(recreated))).toEqual(['created_once']);
    const backwards = events.map((e, i) => (i === 3 ? { ...e, seq: 1 } : e)) as JournalEvent[];
    expect(names(safety(backwards))).toEqual(['seq_order']);
  });

  it('name a decode page reserved for a room while another room holds it', () => {
    let seq = 0;
    const ev = (type: string, room: string, engine: string | null, data: object) =>
      ({
        seq: ++seq,
        ts: 0,
        type,
        room,
        engine,
        source: 'test',
        eventId: `e${seq}`,
        data,
      }) as JournalEvent;
    const created = (room: string, pages: number[]) =>
      ev('room.created', room, null, {
        prefillEngine: 'p0',
        decodeEngine: 'd0',
        reservation: { decode: { pool: '/d0', epoch: 1, pages, incarnation: 'i' } },
      });
    const events = [
      created('a', [1, 2]),
      created('b', [3]),
      // Page 2 is still a's: its decode engine has not released it.
      created('c', [2, 4]),
      ev('room.released', 'a', 'p0', {}),
      // a's prefill engine released it, its decode engine not yet: still a's.
      created('d', [1]),
      ev('room.released', 'a', 'd0', {}),
      // Now it is free.
      created('e', [1, 2]),
    ];
    expect(safety(events)).toEqual([
      expect.objectContaining({ invariant: 'decode_page_reserved_once', room: 'c', seq: 3 }),
      expect.objectContaining({ invariant: 'decode_page_reserved_once', room: 'd', seq: 5 }),
    ]);
  });

  it('name what breaks liveness once the run settled: a room that never ended, a release missing', async () => {
    const { events, stateOf } = await committed(['a', 'b']);
    const unended = (room: string) => (room === 'a' ? 'decoding' : stateOf(room));
    expect(liveness(events, unended)).toEqual([
      expect.objectContaining({
        invariant: 'every_room_ends',
        room: 'a',
        detail: 'still decoding',
      }),
    ]);
    const lastRelease = events.findLastIndex((e) => e.type === 'room.released' && e.room === 'b');
    const unreleased = events.filter((_, i) => i !== lastRelease);
    expect(liveness(unreleased, stateOf)).toEqual([
      expect.objectContaining({
        invariant: 'every_room_released',
        room: 'b',
        detail: 'completed, never released by d0',
      }),
    ]);
  });
});
