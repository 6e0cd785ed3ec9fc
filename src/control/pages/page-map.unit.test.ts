import { describe, expect, it } from 'vitest';
import type { JournalEvent } from '../../room/events.ts';
import { PageMap } from './page-map.ts';

let seq = 0;
const ev = (type: string, engine: string, room: string | null, data: Record<string, unknown>) =>
  ({
    seq: ++seq,
    ts: 0,
    type,
    room,
    engine,
    source: 't',
    eventId: `e${seq}`,
    data,
  }) as JournalEvent;
const registered = (engine: string, incarnation: string, role = 'decode', pages = 16) =>
  ev('engine.registered', engine, null, { role, incarnation, pages });
const created = (room: string, pages: number[], incarnation = 'i1', engine = 'd0') => ({
  ...ev('room.created', 'control', room, {
    prefillEngine: 'p0',
    decodeEngine: engine,
    reservation: { decode: { pages, pool: '/p', epoch: 1, incarnation } },
  }),
  engine: null,
});
const pool = (incarnation = 'i1', pages = 16) => ({ engine: 'd0', incarnation, pages });
const bootstrapped = (room: string, pages: number[], engine = 'd0') =>
  ev('room.bootstrapped', engine, room, { pages, pool: '/p', epoch: 1 });
const released = (room: string, engine = 'd0') => ev('room.released', engine, room, { pages: [] });

describe('the decode page map', () => {
  it('holds what a room was given until its decode engine releases it', () => {
    const m = new PageMap();
    m.fold(registered('d0', 'i1'));
    expect(m.fold(bootstrapped('r1', [0, 1, 2]))).toEqual([]);
    expect(m.fold(bootstrapped('r2', [3, 4]))).toEqual([]);
    expect(m.heldOn('d0')).toBe(5);
    // The prefill engine's release frees nothing of the decode pool.
    m.fold(released('r1', 'p0'));
    expect(m.heldOn('d0')).toBe(5);
    m.fold(released('r1'));
    expect(m.heldOn('d0')).toBe(2);
    expect(m.fold(bootstrapped('r3', [0, 1]))).toEqual([]);
    expect(m.conflicts).toBe(0);
  });

  it('counts a page reserved while it still holds it for another room', () => {
    const m = new PageMap();
    m.fold(bootstrapped('r1', [7, 8]));
    const found = m.fold(bootstrapped('r2', [8, 9]));
    expect(found).toEqual([{ engine: 'd0', page: 8, room: 'r2', heldBy: 'r1' }]);
    expect(m.conflicts).toBe(1);
    expect(m.lastConflict).toEqual(found[0]);
    // r1's release leaves page 8 with r2, which holds it now.
    m.fold(released('r1'));
    expect(m.heldOn('d0')).toBe(2);
  });

  it('starts a new incarnation with an empty pool, and keeps the pool across a reconnection', () => {
    const m = new PageMap();
    m.fold(registered('d0', 'i1'));
    m.fold(bootstrapped('r1', [0, 1]));
    m.fold(registered('d0', 'i1'));
    expect(m.heldOn('d0')).toBe(2);
    m.fold(registered('d0', 'i2'));
    expect(m.heldOn('d0')).toBe(0);
    expect(m.fold(bootstrapped('r2', [0, 1]))).toEqual([]);
    // Prefill engines' registrations and other engines' pools are not touched.
    m.fold(registered('d0', 'i2', 'prefill'));
    m.fold(bootstrapped('r3', [0], 'd1'));
    expect([m.heldOn('d0'), m.heldOn('d1')]).toEqual([2, 1]);
  });

  it('chooses free pages for a reservation, lowest first, and frees them on the release or the refusal', () => {
    const m = new PageMap();
    m.fold(registered('d0', 'i1', 'decode', 8));
    expect(m.reserve('r1', pool('i1', 8), 3)).toEqual([0, 1, 2]);
    expect(m.reserve('r2', pool('i1', 8), 3)).toEqual([3, 4, 5]);
    // Only 2 left: nothing is held for r3.
    expect(m.reserve('r3', pool('i1', 8), 3)).toBeNull();
    expect(m.heldOn('d0')).toBe(6);
    // Their room.created and room.bootstrapped commit the same pages: no change, no conflict.
    m.fold(created('r1', [0, 1, 2]));
    m.fold(bootstrapped('r1', [0, 1, 2]));
    expect([m.heldOn('d0'), m.conflicts]).toEqual([6, 0]);
    // r2's room.created was refused by the journal; r1 completes.
    m.unreserve('r2', 'd0');
    m.fold(released('r1'));
    expect(m.heldOn('d0')).toBe(0);
    expect(m.reserve('r4', pool('i1', 8), 8)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
  });

  it('never chooses a page a committed event holds, and replaces the pool of an older incarnation', () => {
    const m = new PageMap();
    m.fold(registered('d0', 'i1', 'decode', 4));
    // Another control plane reserved these (a failover), and an engine chose its own.
    m.fold(created('r1', [0, 2]));
    m.fold(bootstrapped('r2', [3]));
    expect(m.reserve('r3', pool('i1', 4), 1)).toEqual([1]);
    expect(m.reserve('r4', pool('i1', 4), 1)).toBeNull();
    expect(m.conflicts).toBe(0);
    // A reservation in a pool since replaced holds nothing in the new one.
    m.fold(registered('d0', 'i2', 'decode', 4));
    m.fold(created('r5', [0, 1], 'i1'));
    expect(m.heldOn('d0')).toBe(0);
    expect(m.reserve('r6', pool('i2', 4), 4)).toEqual([0, 1, 2, 3]);
    // A session of a newer incarnation than the map has seen replaces the pool at once.
    expect(m.reserve('r7', pool('i3', 4), 2)).toEqual([0, 1]);
  });

  it('counts a committed reservation of a page it holds for another room', () => {
    const m = new PageMap();
    m.fold(registered('d0', 'i1'));
    m.fold(created('r1', [4, 5]));
    expect(m.fold(created('r2', [5, 6]))).toEqual([
      { engine: 'd0', page: 5, room: 'r2', heldBy: 'r1' },
    ]);
    m.fold(released('r1'));
    // Page 5 stays r2's: it is not chosen again until r2 releases it.
    expect(m.reserve('r3', pool(), 16 - 2)).not.toContain(5);
  });
});
