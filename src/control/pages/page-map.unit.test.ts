import { describe, expect, it } from 'vitest';
import type { JournalEvent } from '../../journal/events.ts';
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
const registered = (engine: string, incarnation: string, role = 'decode') =>
  ev('engine.registered', engine, null, { role, incarnation });
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
});
