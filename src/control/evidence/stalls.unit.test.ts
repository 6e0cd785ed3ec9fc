import { describe, expect, it } from 'vitest';
import { engineSession, type SessionOverrides } from '../../../test/helpers/engine-session.ts';
import type { EventType } from '../../room/events.ts';
import { type ReducibleEvent, type Room, reduce } from '../../room/reducer.ts';
import type { EngineSession } from '../engines/engine-session.ts';
import { DEFAULT_STALL_POLICY, findStalls } from './stalls.ts';

const NOW = 1_000_000;

const session = (
  engine: string,
  role: 'prefill' | 'decode',
  over: SessionOverrides = {},
  queues: Record<string, number> = {},
) => engineSession(engine, role, over, queues, NOW);

/** A room folded by the real reducer through `steps`, the last of them at `at`. */
function room(id: string, steps: EventType[], at: number): Room {
  let r: Room | null = null;
  let seq = 0;
  for (const type of ['room.created', ...steps] as EventType[]) {
    const data: Record<string, unknown> =
      type === 'room.created'
        ? { prefillEngine: 'p0', decodeEngine: 'd0', promptTokens: 4, maxTokens: 4 }
        : type === 'room.bootstrapped'
          ? { pages: [1] }
          : {};
    const res = reduce(r, {
      seq: ++seq,
      ts: at,
      type,
      room: id,
      engine: null,
      data,
    } as ReducibleEvent);
    if (!res.ok) throw new Error(`${type}: ${res.detail}`);
    r = res.room;
  }
  return r as Room;
}

const find = (sessions: EngineSession[], rooms: Room[] = [], writable = true, lateAt = 0) =>
  findStalls(sessions, rooms, DEFAULT_STALL_POLICY, NOW, { journalWritable: writable, lateAt }).map(
    (s) => `${s.engine}:${s.kind}`,
  );

describe('findStalls', () => {
  it('finds nothing on engines that move', () => {
    const p0 = session('p0', 'prefill', {}, { waiting: 3, active: 1, transferring: 1 });
    const d0 = session('d0', 'decode', {}, { decoding: 5 });
    const rooms = [room('r1', [], NOW - 50), room('r2', ['room.bootstrap_started'], NOW - 50)];
    expect(find([p0, d0], rooms)).toEqual([]);
  });

  it('a bus loop behind for over a second: the wedge of docs/incident.md', () => {
    const p0 = session('p0', 'prefill', { behindSince: NOW - 1200 });
    const [s] = findStalls([p0], [], DEFAULT_STALL_POLICY, NOW);
    expect(s).toEqual({
      engine: 'p0',
      kind: 'bus',
      reason: 'bus loop applied nothing for 1200 ms after being sent events',
      since: NOW - 1200,
    });
  });

  it('a control plane that was itself blocked blames no engine until it has listened long enough', () => {
    const behind = session('p0', 'prefill', { behindSince: NOW - 1200 });
    const frozen = session('d0', 'decode', { transferMovedAt: NOW - 1500 }, { transferring: 2 });
    const idle = session('d1', 'decode', { workMovedAt: NOW - 3500 }, { decoding: 4 });
    expect(find([behind, frozen, idle])).toEqual(['p0:bus', 'd0:transfer', 'd1:work']);
    // Its loop was late 300 ms ago: what it heard before then may have been heard late.
    expect(find([behind, frozen, idle], [], true, NOW - 300)).toEqual([]);
    // Long enough ago, the evidence stands again.
    expect(find([behind], [], true, NOW - 600)).toEqual(['p0:bus']);
  });

  it('a work loop whose tick stopped with rooms queued, unless the journal is what it waits on', () => {
    const p0 = session('p0', 'prefill', { workMovedAt: NOW - 3500 }, { waiting: 2, active: 1 });
    expect(findStalls([p0], [], DEFAULT_STALL_POLICY, NOW)[0]?.reason).toBe(
      'work loop did nothing for 3500 ms with 3 rooms queued',
    );
    expect(find([p0], [], false)).toEqual([]);
    // Its only active rooms are transferring: that is the transfer core's work, not the loop's.
    const sending = session(
      'p0',
      'prefill',
      { workMovedAt: NOW - 3500 },
      { waiting: 0, active: 2, transferring: 2 },
    );
    expect(find([sending])).toEqual([]);
    const d0 = session('d0', 'decode', { workMovedAt: NOW - 3500 }, { decoding: 4 });
    expect(find([d0])).toEqual(['d0:work']);
  });

  it('rooms piling up on an engine that shows no progress, counted from the oldest arrival', () => {
    // Three rooms created 6 s ago for d0, which has moved nothing for 7 s.
    const rooms = [1, 2, 3].map((i) => room(`r${i}`, [], NOW - 6000));
    const stale = session('d0', 'decode', { progressAt: NOW - 7000 });
    const [s] = findStalls([stale], rooms, DEFAULT_STALL_POLICY, NOW);
    expect(s?.kind).toBe('pile_up');
    expect(s?.reason).toBe(
      '3 rooms waiting on it in created, and none of its rooms moved for 6000 ms',
    );
    // Progress a second ago (a token, a transition, a work tick): not stalled.
    expect(find([session('d0', 'decode', { progressAt: NOW - 1000 })], rooms)).toEqual([]);
    // An idle engine that just got work has had no time to move it yet.
    const fresh = [room('r9', [], NOW - 2000)];
    expect(find([stale], fresh)).toEqual([]);
  });

  it('rooms in a state another engine owns do not count against it', () => {
    // Waiting for input is the prefill engine's to move; the decode engine idle for long is fine.
    const waiting = [room('r1', ['room.bootstrap_started', 'room.bootstrapped'], NOW - 9000)];
    const d0 = session('d0', 'decode', { progressAt: NOW - 60_000 });
    expect(find([d0], waiting)).toEqual([]);
    const p0 = session('p0', 'prefill', { progressAt: NOW - 60_000 });
    expect(find([p0], waiting)).toEqual(['p0:pile_up']);
  });

  it('canaries failing in a row on the engine that owns their stage', () => {
    const twice = session('p0', 'prefill', { canaryFailures: 2, canaryReason: 'prefill: x' });
    expect(find([twice])).toEqual([]);
    const thrice = session('p0', 'prefill', {
      canaryFailures: 3,
      canaryFailingSince: NOW - 15_000,
      canaryReason: 'prefill: no progress past prefilling within 2000 ms',
    });
    expect(findStalls([thrice], [], DEFAULT_STALL_POLICY, NOW)[0]).toEqual({
      engine: 'p0',
      kind: 'canary',
      reason:
        '3 canaries in a row failed on it: prefill: no progress past prefilling within 2000 ms',
      since: NOW - 15_000,
    });
  });

  it('engines not yet live are not judged', () => {
    const p0 = session('p0', 'prefill', { live: false, behindSince: NOW - 5000 });
    expect(find([p0])).toEqual([]);
  });
});
