/**
 * FleetActions carrying out the planner's steps — against a stand-in control plane and supervisor
 * (the parts it drives, isolated here; test/planner.e2e.test.ts and the drill run it on real
 * processes): what it journals, and how long a retiring engine's drain lasts.
 */
import { describe, expect, it } from 'vitest';
import { foldRoom, roomEvent } from '../../test/helpers/room-events.ts';
import type { ControlPlane } from '../control/control-plane.ts';
import type { AppendResult } from '../journal/store.ts';
import { silentLogger } from '../log.ts';
import type { EngineSupervisor } from '../recovery/supervisor.ts';
import type { EventInput } from '../room/events.ts';
import { FleetActions, soonestDrained } from './fleet-actions.ts';

/** Live rooms by the engines they are on (prefill, decode); changed by the test. */
type Rooms = Array<[string, string]>;

/** Two prefill and two decode engines under a stand-in control plane and supervisor. */
function fleet(rooms: Rooms, holdAfterCrashLoopMs?: number) {
  const engines = new Map<string, 'prefill' | 'decode'>([
    ['prefill-0', 'prefill'],
    ['prefill-1', 'prefill'],
    ['decode-0', 'decode'],
    ['decode-1', 'decode'],
  ]);
  const view = (id: string) => ({
    engine: id,
    role: engines.get(id),
    liveRooms: rooms.filter(([p, d]) => p === id || d === id).length,
  });
  const retiring = new Set<string>();
  const control = {
    engines: () => [...engines.keys()].map(view),
    engine: (id: string) => (engines.has(id) ? view(id) : undefined),
    liveRooms: () => [],
    registry: { retiring },
    retire: async (id: string) => {
      retiring.add(id);
      return 0;
    },
    forgetEngine: (id: string) => engines.delete(id),
  } as unknown as ControlPlane;
  const stopped: string[] = [];
  const supervisor = {
    ids: () => [...engines.keys()],
    start: (spec: { id: string; role: 'prefill' | 'decode' }) => engines.set(spec.id, spec.role),
    retire: async (id: string) => {
      stopped.push(id);
      return true;
    },
  } as unknown as EngineSupervisor;
  const journaled: EventInput[] = [];
  const journal = {
    append: async (ev: EventInput): Promise<AppendResult> => {
      journaled.push(ev);
      return {
        status: 'applied',
        seq: journaled.length,
        eventId: `e${journaled.length}`,
        state: null,
      };
    },
  };
  const actions = new FleetActions({
    control,
    journal,
    engines: supervisor,
    args: [],
    log: silentLogger,
    drainDeadlineMs: 1_500,
    startTimeoutMs: 1_000,
    ...(holdAfterCrashLoopMs === undefined ? {} : { holdAfterCrashLoopMs }),
  });
  return { actions, control, journaled, stopped };
}

const states = (evs: EventInput[]) =>
  evs.map((e) => `${e.engine} ${(e.data as { state: string }).state}`);
const tick = () => new Promise((r) => setTimeout(r, 300));

describe('fleet actions', () => {
  it('a change of role retires the engine of the other role with the fewest rooms once they finished, then starts one in its place', async () => {
    const rooms: Rooms = [
      ['prefill-0', 'decode-0'],
      ['prefill-1', 'decode-1'],
      ['prefill-1', 'decode-1'],
    ];
    const f = fleet(rooms);
    const step = f.actions.step('rebalance_to_prefill');
    await tick();
    // decode-0 is draining: no new rooms, and not stopped while its room runs.
    expect(f.control.registry.retiring.has('decode-0')).toBe(true);
    expect(f.stopped).toEqual([]);
    rooms.splice(0, 1);
    await step;
    expect(f.stopped).toEqual(['decode-0']);
    expect(states(f.journaled)).toEqual([
      'decode-0 draining',
      'decode-0 drained',
      'decode-0 stopped',
      'prefill-2 started',
    ]);
    expect(f.journaled[1]?.data).toMatchObject({ rooms: 0 });
    expect(f.journaled[3]?.data).toMatchObject({ role: 'prefill', replaces: 'decode-0' });
  });

  it('a step down waits for the rooms up to the drain deadline, then stops the engine with them left (they move)', async () => {
    const f = fleet([
      ['prefill-0', 'decode-0'],
      ['prefill-1', 'decode-1'],
      ['prefill-1', 'decode-1'],
    ]);
    const step = f.actions.step('decode_idle');
    await tick();
    expect(f.stopped).toEqual([]);
    await step;
    expect(f.stopped).toEqual(['decode-0']);
    expect(states(f.journaled)).toEqual([
      'decode-0 draining',
      'decode-0 drained',
      'decode-0 stopped',
    ]);
    expect(f.journaled[1]?.data).toMatchObject({ rooms: 1 });
  });

  it('retires the engine whose drain ends soonest: the fewest prompt tokens in prefill, then the fewest rooms', () => {
    const on = (d: string, promptTokens: number, begun: boolean) =>
      foldRoom(
        roomEvent('room.created', { prefillEngine: 'p0', decodeEngine: d, promptTokens }),
        ...(begun ? [roomEvent('room.prefill_started', {}, 'p0')] : []),
      );
    const engines = [
      { engine: 'd0', liveRooms: 1 },
      { engine: 'd1', liveRooms: 3 },
      { engine: 'd2', liveRooms: 2 },
    ];
    // d0's one room is a long prompt in prefill; d1's and d2's wait in the queue (they would move).
    const rooms = [
      on('d0', 8000, true),
      on('d1', 20, true),
      ...[1, 2].map(() => on('d2', 500, false)),
    ];
    expect(soonestDrained(engines, rooms)).toBe('d2');
    expect(soonestDrained(engines, [])).toBe('d0');
    expect(soonestDrained([], rooms)).toBeUndefined();
  });

  it('writes off an engine it started that crash-loops: stopped, forgotten, its id never reused, its role held for a while', async () => {
    const f = fleet([], 400);
    await f.actions.step('prefill_short');
    expect(states(f.journaled)).toEqual(['prefill-2 started']);
    // An engine it did not start is the operator's: the supervisor's give_up is all.
    await f.actions.gaveUp('decode-0', 'crash loop: 6 exits in 600 s (last: code 1)');
    expect(f.journaled).toHaveLength(1);
    expect(f.control.engine('decode-0')).toBeDefined();

    await f.actions.gaveUp('prefill-2', 'crash loop: 6 exits in 600 s (last: code 1)');
    expect(states(f.journaled)).toEqual(['prefill-2 started', 'prefill-2 stopped']);
    expect(f.journaled[1]?.data).toMatchObject({
      role: 'prefill',
      by: 'planner',
      reason: 'crash loop: 6 exits in 600 s (last: code 1)',
    });
    expect(f.control.engine('prefill-2')).toBeUndefined();
    // Held: the next step short of prefill starts nothing; decode is not held.
    await f.actions.step('prefill_short');
    expect(f.journaled).toHaveLength(2);
    await f.actions.step('decode_short');
    expect(states(f.journaled).at(-1)).toBe('decode-2 started');
    // Once the hold is over a new engine starts, under an id of its own.
    await new Promise((r) => setTimeout(r, 450));
    await f.actions.step('prefill_short');
    expect(states(f.journaled).at(-1)).toBe('prefill-3 started');
  });
});
