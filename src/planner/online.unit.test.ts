/** The planner as `pdctl serve` runs it, on the in-memory journal and a virtual clock. */
import { describe, expect, it } from 'vitest';
import { MemoryDisk } from '../journal/memory/disk.ts';
import { completedRoomEvents } from '../journal/synth.ts';
import { silentLogger } from '../log.ts';
import type { EventInput } from '../room/events.ts';
import { VirtualClock } from '../sim/world/clock.ts';
import { MemoryJournal } from '../sim/world/journal.ts';
import { Planner } from './online.ts';

/** Lets the journal's turns and the planner's awaits run, the clock standing still. */
async function settle(clock: VirtualClock): Promise<void> {
  for (let i = 0; i < 100; i++) {
    clock.advance(0);
    await new Promise((r) => setImmediate(r));
  }
}

/** A room whose prefill computed `prefillMs` and decode `decodeMs`. */
function room(i: number, prefillMs: number, decodeMs: number): EventInput[] {
  return completedRoomEvents(`r-${i}`).map((ev) =>
    ev.type === 'room.transfer_posted'
      ? { ...ev, data: { ...ev.data, computeMicros: prefillMs * 1000 } }
      : ev.type === 'room.completed'
        ? { ...ev, data: { ...ev.data, computeMicros: decodeMs * 1000 } }
        : ev,
  );
}

function setUp(mode: 'advise' | 'off' = 'advise') {
  const clock = new VirtualClock();
  const journal = MemoryJournal.open({ disk: new MemoryDisk('planner'), clock });
  const planner = new Planner(
    journal,
    () => ({ prefill: 2, decode: 2 }),
    mode,
    { budget: 4, hold: 1, intervalMs: 60_000 },
    clock,
    silentLogger,
  );
  let rooms = 0;
  /**
   * A minute in which 60 rooms ran, each with this much compute a role; `atEnd` runs after they
   * committed and before the interval ends.
   */
  const minute = async (prefillMs: number, decodeMs: number, atEnd = () => {}) => {
    const appended = Promise.all(
      Array.from({ length: 60 }, () => room(rooms++, prefillMs, decodeMs))
        .flat()
        .map((ev) => journal.append(ev)),
    );
    await settle(clock);
    await appended;
    atEnd();
    clock.advance(60_000);
    await settle(clock);
  };
  const decisions = () => journal.tail({ type: 'planner.decision', limit: 100, order: 'oldest' });
  return { clock, journal, planner, minute, decisions };
}

describe('the planner in a serving control plane', () => {
  it('journals a decision each interval from what was committed in it, and keeps the last', async () => {
    const { planner, minute, decisions } = setUp();
    await planner.start();
    // 60 rooms × 2.6 s of prefill in 60 s: 2.6 engines busy; decode 0.3.
    await minute(2600, 300);
    const [first, ...rest] = await decisions();
    expect(rest).toEqual([]);
    expect(first?.source).toBe('planner');
    expect(first?.data).toMatchObject({
      mode: 'advise',
      reason: 'rebalance_to_prefill',
      fleet: { prefill: 2, decode: 2 },
      proposal: { prefill: 3, decode: 1 },
      acted: false,
    });
    expect(first?.data.inputs.arrivalsPerS).toBeCloseTo(1, 5);
    expect(planner.status().last?.reason).toBe('rebalance_to_prefill');
    await minute(300, 2600);
    expect((await decisions()).map((d) => d.data.reason)).toEqual([
      'rebalance_to_prefill',
      'rebalance_to_decode',
    ]);
    await planner.stop();
  });

  it('goes on deciding while the journal refuses writes, and journals again once it takes them', async () => {
    const { planner, journal, minute, decisions } = setUp();
    await planner.start();
    await minute(2600, 300, () => journal.refuseWrites('disk full'));
    expect(await decisions()).toEqual([]);
    expect(planner.status().last?.reason, 'decided, though not journaled').toBeDefined();
    journal.refuseWrites(null);
    await minute(300, 2600);
    expect((await decisions()).length).toBe(1);
    await planner.stop();
  });

  it('with --planner off: nothing folded, nothing journaled', async () => {
    const { planner, minute, decisions } = setUp('off');
    await planner.start();
    await minute(2600, 300);
    expect(await decisions()).toEqual([]);
    expect(planner.status().last).toBeNull();
  });
});
