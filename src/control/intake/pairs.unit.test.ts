import { describe, expect, it } from 'vitest';
import { engineSession, type SessionOverrides } from '../../../test/helpers/engine-session.ts';
import type { KvRemote } from '../../bus/protocol.ts';
import type { JournalEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import { choosePair, PAIR_COSTS, PairHealth, transportBetween, unreachable } from './pairs.ts';

const remote: KvRemote = {
  transport: 'ucx',
  address: new Uint8Array([1, 2, 3]),
  pages: 10,
  pageBytes: 4096,
  epoch: 1,
};

const at = (
  engine: string,
  role: 'prefill' | 'decode',
  host: string,
  over: SessionOverrides = {},
) => engineSession(engine, role, { host, ...over });

describe('transportBetween', () => {
  it('uses shared memory on one host and UCX between hosts, as the prefill engine will', () => {
    const p = at('p0', 'prefill', 'A');
    expect(transportBetween(p, at('d0', 'decode', 'A'))).toBe('shm');
    expect(transportBetween(p, at('d1', 'decode', 'B', { kvRemote: remote }))).toBe('ucx');
    expect(transportBetween(p, at('d2', 'decode', 'A', { kvDevice: 0 }))).toBe('cuda');
  });

  it('finds no way between hosts without UCX on both ends', () => {
    expect(transportBetween(at('p0', 'prefill', 'A'), at('d1', 'decode', 'B'))).toBeNull();
    const shmOnly = at('p0', 'prefill', 'A', { kvSend: 'shm' });
    expect(transportBetween(shmOnly, at('d1', 'decode', 'B', { kvRemote: remote }))).toBeNull();
    expect(transportBetween(shmOnly, at('d0', 'decode', 'A'))).toBe('shm');
  });

  it('sends over UCX on one host too when the prefill engine says ucx', () => {
    const p = at('p0', 'prefill', 'A', { kvSend: 'ucx' });
    expect(transportBetween(p, at('d0', 'decode', 'A', { kvRemote: remote }))).toBe('ucx');
    expect(transportBetween(p, at('d0', 'decode', 'A'))).toBeNull();
  });

  it('takes an engine that did not say its host for any host', () => {
    expect(transportBetween(at('p0', 'prefill', 'A'), engineSession('d0', 'decode'))).toBe('shm');
  });
});

/** Rooms per engine, as the room book would count them. */
const rooms = (n: Record<string, number>) => (engine: string) => n[engine] ?? 0;

describe('choosePair', () => {
  it('is least loaded per role when every pair is on one host', () => {
    const ps = [at('p0', 'prefill', 'A'), at('p1', 'prefill', 'A')];
    const ds = [at('d0', 'decode', 'A'), at('d1', 'decode', 'A')];
    const pair = choosePair(ps, ds, { roomsOn: rooms({ p0: 3, d1: 1 }) });
    expect([pair?.prefill.engine, pair?.decode.engine, pair?.transport]).toEqual([
      'p1',
      'd0',
      'shm',
    ]);
  });

  it('keeps a room on one host until the cross-host pair is cheaper by more than its cost', () => {
    const p = at('p0', 'prefill', 'A');
    const local = at('dA', 'decode', 'A');
    const far = at('dB', 'decode', 'B', { kvRemote: remote });
    let roomsOn = rooms({ dA: PAIR_COSTS.ucx });
    expect(choosePair([p], [far, local], { roomsOn })?.decode.engine).toBe('dA');
    roomsOn = rooms({ dA: PAIR_COSTS.ucx + 1 });
    expect(choosePair([p], [local, far], { roomsOn })).toMatchObject({ transport: 'ucx' });
    expect(choosePair([p], [local, far], { roomsOn })?.decode.engine).toBe('dB');
  });

  it('prefers the host pair that exists over a lighter pair that cannot move KV', () => {
    const ps = [at('pA', 'prefill', 'A'), at('pB', 'prefill', 'B')];
    const ds = [at('dA', 'decode', 'A')];
    expect(choosePair(ps, ds, { roomsOn: rooms({ pA: 5 }) })?.prefill.engine).toBe('pA');
  });

  it('finds nothing, and says why, when no pair can move KV', () => {
    const ps = [at('pA', 'prefill', 'A')];
    const ds = [at('dB', 'decode', 'B')];
    expect(choosePair(ps, ds)).toBeNull();
    expect(unreachable(ps, ds)).toMatch(/pA@h-[0-9a-f]{6}.*dB@h-[0-9a-f]{6}.*UCX on both ends/);
  });
});

describe('PairHealth', () => {
  it('passes over a pair whose KV could not move while another can take the room', () => {
    const health = new PairHealth(5000, 60_000);
    const p = at('pA', 'prefill', 'A');
    const local = at('dA', 'decode', 'A');
    const far = at('dB', 'decode', 'B', { kvRemote: remote });
    const w = {
      avoid: (x: string, y: string) => health.avoid(x, y, now),
      roomsOn: rooms({ dA: 9 }),
    };
    let now = 1_000_000;
    expect(choosePair([p], [local, far], w)?.decode.engine).toBe('dB');
    health.failed('pA', 'dB', now);
    expect(choosePair([p], [local, far], w)?.decode.engine).toBe('dA');
    // With no other pair, the avoided one is still tried (the link may have healed).
    expect(choosePair([p], [far], w)?.decode.engine).toBe('dB');
    now += 5001;
    expect(choosePair([p], [local, far], w)?.decode.engine).toBe('dB');
  });

  it('backs off longer for each failure after a pause, and a completed transfer clears it', () => {
    const health = new PairHealth(1000, 4000);
    // Three rooms caught by one cut: one pause, not three doublings.
    for (let i = 0; i < 3; i++) health.failed('p', 'd', 0);
    expect(health.avoid('p', 'd', 999)).toBe(true);
    expect(health.avoid('p', 'd', 1000)).toBe(false);
    // Each failure after a pause doubles the next, up to the cap.
    health.failed('p', 'd', 1000);
    expect(health.avoid('p', 'd', 2999)).toBe(true);
    health.failed('p', 'd', 3000);
    health.failed('p', 'd', 7000);
    health.failed('p', 'd', 11_000);
    expect(health.avoid('p', 'd', 14_999)).toBe(true);
    expect(health.avoid('p', 'd', 15_000)).toBe(false);
    health.failed('p', 'd', 10_000);
    health.moved('p', 'd');
    expect(health.avoid('p', 'd', 10_001)).toBe(false);
    expect(health.avoid('d', 'p', 0)).toBe(false);
  });

  it('after a pause lets one room probe the pair and keeps the others away until it has a verdict', () => {
    const health = new PairHealth(1000, 8000);
    // What the commit stage hands PairHealth: the room as folded and the event that ended it.
    const ended = (room: string, type: string, ts: number, reason: string | null = null) =>
      health.fold(
        { room, prefillEngine: 'p', decodeEngine: 'd', state: 'failed', reason } as Room,
        { type, ts } as JournalEvent,
      );
    health.failed('p', 'd', 0);
    health.taken('p', 'd', 'early', 500); // placed during the pause (no other pair): no probe
    expect(health.avoid('p', 'd', 1000)).toBe(false);
    health.taken('p', 'd', 'r1', 1000);
    health.taken('p', 'd', 'r2', 1001);
    // r1 probes; r2 came by a fallback. Every later room keeps away while r1 is out.
    expect(health.avoid('p', 'd', 1500)).toBe(true);
    expect(health.avoid('p', 'd', 7000)).toBe(true);
    // The probe's transfer failed: the pause doubles from then.
    ended('r1', 'room.failed', 7000, 'transfer_stalled');
    expect(health.avoid('p', 'd', 8999)).toBe(true);
    expect(health.avoid('p', 'd', 9000)).toBe(false);
    // A probe that ends without a verdict on the link (a client's abort) hands the probe on.
    health.taken('p', 'd', 'r3', 9000);
    expect(health.avoid('p', 'd', 9001)).toBe(true);
    ended('r3', 'room.aborted', 9100);
    expect(health.avoid('p', 'd', 9101)).toBe(false);
    // One whose creation never committed lapses after the longest pause.
    health.taken('p', 'd', 'r4', 9200);
    expect(health.avoid('p', 'd', 17_199)).toBe(true);
    expect(health.avoid('p', 'd', 17_200)).toBe(false);
    // A probe whose transfer completes clears the pair.
    health.taken('p', 'd', 'r5', 17_200);
    health.fold(
      { room: 'r5', prefillEngine: 'p', decodeEngine: 'd', state: 'decoding' } as Room,
      { type: 'room.transfer_completed', ts: 17_300 } as JournalEvent,
    );
    expect(health.avoid('p', 'd', 17_301)).toBe(false);
    health.taken('p', 'd', 'r6', 17_301);
    expect(health.avoid('p', 'd', 17_302)).toBe(false);
  });
});
