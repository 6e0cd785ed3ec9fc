import { describe, expect, it } from 'vitest';
import { engineSession } from '../../../test/helpers/engine-session.ts';
import type { RoomFailureReason } from '../../room/reasons.ts';
import { recordCanary } from './engine-health.ts';

const pair = { prefillEngine: 'p0', decodeEngine: 'd0' };

/** The canary failures each engine has after one failed canary. */
function failuresAfter(stage: string, failure: RoomFailureReason | null, writable = true) {
  const sessions = new Map([
    ['p0', engineSession('p0', 'prefill')],
    ['d0', engineSession('d0', 'decode')],
  ]);
  recordCanary(
    (id) => sessions.get(id),
    pair,
    { ok: false, stage, reason: 'x', failure },
    writable,
    1000,
  );
  return Object.fromEntries([...sessions].map(([id, s]) => [id, s.health.canaryFailures]));
}

describe('recordCanary: whom a failed canary counts against', () => {
  it('a room that stopped making progress: the engine owning the stage it stopped in', () => {
    expect(failuresAfter('transfer', null)).toEqual({ p0: 1, d0: 0 });
    expect(failuresAfter('decode', null)).toEqual({ p0: 0, d0: 1 });
    expect(failuresAfter('bootstrap', 'deadline_exceeded')).toEqual({ p0: 0, d0: 1 });
  });

  it('a failure whose reason blames an engine: that engine, whatever the stage', () => {
    expect(failuresAfter('decode', 'kv_exceeds_reservation')).toEqual({ p0: 1, d0: 0 });
    expect(failuresAfter('prefill', 'decode_error')).toEqual({ p0: 0, d0: 1 });
  });

  it('a fault of the pair (a checksum the decode engine found wrong), load, or a journal refusing writes: neither', () => {
    // By its stage (`transferred` is decode's) it was the decode engine's: the simulator found two
    // corrupting prefill engines getting a healthy decode engine declared stalled (seed 189).
    expect(failuresAfter('decode', 'kv_checksum_mismatch')).toEqual({ p0: 0, d0: 0 });
    expect(failuresAfter('bootstrap', 'kv_pool_full')).toEqual({ p0: 0, d0: 0 });
    expect(failuresAfter('transfer', null, false)).toEqual({ p0: 0, d0: 0 });
  });
});
