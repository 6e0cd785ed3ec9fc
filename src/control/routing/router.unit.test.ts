import { describe, expect, it } from 'vitest';
import { engineSession } from '../../../test/helpers/engine-session.ts';
import type { EventData, JournalEvent } from '../../room/events.ts';
import { Router } from './router.ts';

const name = (i: number) => i.toString(16).padStart(32, '0');
const names = (from: number, n: number) => Array.from({ length: n }, (_, i) => name(from + i));

/** A committed event as the index folds it. */
function ev(type: string, engine: string, data: Record<string, unknown>, seq = 1): JournalEvent {
  return {
    seq,
    ts: 0,
    room: type.startsWith('room.') ? 'r' : null,
    engine,
    source: 't',
    eventId: `${seq}`,
    type,
    data,
  } as JournalEvent;
}

const prefix = { blockTokens: 64, capacityBlocks: 100 };
const p0 = engineSession('p0', 'prefill', { prefix });
const p1 = engineSession('p1', 'prefill', { prefix });
const d0 = engineSession('d0', 'decode');
const noAvoid = { avoid: () => false, roomsOn: () => 0 };

describe('router', () => {
  it('kv: sends a request to the engine holding its prefix, unless that engine has more queued than the prefix saves', () => {
    const r = new Router({ policy: 'kv', blockTokens: 64, overlapWeight: 1 });
    r.fold(ev('engine.registered', 'p1', { role: 'prefill', incarnation: 'a' }), false);
    r.fold(ev('room.transfer_posted', 'p1', { storedBlocks: names(0, 4) }, 2), false);
    const req = names(0, 5);
    expect(r.index.overlap('p1', req)).toBe(4);
    expect(r.choose([p0, p1], [d0], req, 320, noAvoid)?.prefill.engine).toBe('p1');
    // p1 takes rooms that queue 1000 tokens of prefill: p0, computing all 320, is cheaper now.
    r.admitted('q1', 'p1', names(100, 20), 1000);
    expect(r.cost('p1', req, 320)).toBeCloseTo((64 + 1000) / 320);
    expect(r.cost('p0', req, 320)).toBe(1);
    expect(r.choose([p0, p1], [d0], req, 320, noAvoid)?.prefill.engine).toBe('p0');
    r.fold(ev('room.transfer_posted', 'p1', {}, 3), false); // room r: not q1, nothing leaves
    r.forget('q1');
    expect(r.choose([p0, p1], [d0], req, 320, noAvoid)?.prefill.engine).toBe('p1');
    // A new incarnation of p1 holds nothing.
    r.fold(ev('engine.registered', 'p1', { role: 'prefill', incarnation: 'b' }, 4), false);
    expect(r.index.overlap('p1', req)).toBe(0);
  });

  it('least-loaded and round-robin ignore what engines hold', () => {
    const held = (policy: 'least-loaded' | 'round-robin') => {
      const r = new Router({ policy, blockTokens: 64, overlapWeight: 1 });
      r.fold(ev('room.transfer_posted', 'p1', { storedBlocks: names(0, 4) }), false);
      return r;
    };
    const ll = held('least-loaded');
    const roomsOn = (e: string) => (e === 'p1' ? 3 : 0);
    expect(
      ll.choose([p0, p1], [d0], names(0, 4), 256, { ...noAvoid, roomsOn })?.prefill.engine,
    ).toBe('p0');
    const rr = held('round-robin');
    const picks = Array.from(
      { length: 4 },
      () => rr.choose([p0, p1], [d0], names(0, 4), 256, noAvoid)?.prefill.engine,
    );
    expect(picks).toEqual(['p0', 'p1', 'p0', 'p1']);
  });

  it('vets what engines say they stored: only blocks of the room, within the cache, of this block size', () => {
    const r = new Router({ policy: 'kv', blockTokens: 64, overlapWeight: 1 });
    r.admitted('room1', 'p0', names(0, 3), 200);
    // Checked at the bus (engine-appends.ts): every name is a block name.
    const posted = (room: string, data: EventData<'room.transfer_posted'>) =>
      ({ type: 'room.transfer_posted', room, data }) as const;
    const data = {
      pairs: 1,
      storedBlocks: [name(0), name(7), name(1)],
      evictedBlocks: [name(9)],
    };
    const v = r.vet({ prefix }, posted('room1', data));
    expect(v.event).toEqual(
      posted('room1', { pairs: 1, storedBlocks: [name(0), name(1)], evictedBlocks: [name(9)] }),
    );
    expect(v.refused).toBe(1);
    // Beyond its cache's capacity, for another room, from an engine without a cache or of another block size.
    expect(
      r.vet({ prefix: { blockTokens: 64, capacityBlocks: 1 } }, posted('room1', data)).event.data
        .storedBlocks,
    ).toEqual([name(0)]);
    expect(r.vet({ prefix }, posted('room2', data)).event.data.storedBlocks).toBeUndefined();
    // Names that are not the room's do not use up the capacity left for those that are.
    const two = { prefix: { blockTokens: 64, capacityBlocks: 2 } };
    const foreignFirst = posted('room1', { storedBlocks: [name(7), name(8), name(0), name(1)] });
    expect(r.vet(two, foreignFirst)).toEqual({
      event: posted('room1', { storedBlocks: [name(0), name(1)] }),
      refused: 2,
    });
    expect(r.vet({ prefix: null }, posted('room1', data)).refused).toBe(4);
    expect(
      r.vet({ prefix: { blockTokens: 16, capacityBlocks: 100 } }, posted('room1', data)).event.data,
    ).toEqual({ pairs: 1 });
    // Once its KV is posted, the room's blocks can no longer be claimed.
    r.fold({ ...ev('room.transfer_posted', 'p0', {}), room: 'room1' } as JournalEvent, false);
    expect(r.vet({ prefix }, posted('room1', data)).event.data.storedBlocks).toBeUndefined();
  });
});
