/**
 * The planner replayed over a real journal file: a fleet of 2 prefill and 2 decode engines
 * serving a prefill-heavy hour, a quiet gap, then a decode-heavy one.
 */
import { describe, expect, it } from 'vitest';
import { tempDir } from '../../test/helpers/tmp.ts';
import { SqliteJournal } from '../journal/sqlite/journal.ts';
import { eventPages } from '../journal/store.ts';
import { completedRoomEvents } from '../journal/synth.ts';
import type { EventInput } from '../room/events.ts';
import { type Decision, PLANNER_DEFAULTS } from './model.ts';
import { PLANNER_EVENTS, replayPlanner } from './replay.ts';

const dir = tempDir('pdctl-planner-');
const T0 = Date.UTC(2026, 11, 1, 3, 0, 0);
const MIN = 60_000;

/** One room a second for `minutes` from `start`, with this much compute per room on each role. */
function phase(start: number, minutes: number, prefillMs: number, decodeMs: number): EventInput[] {
  const out: EventInput[] = [];
  for (let s = 0; s < minutes * 60; s++) {
    const room = `r-${start + s * 1000}`;
    const at = start + s * 1000;
    const evs = completedRoomEvents(room, `p${s % 2}`, `d${s % 2}`);
    evs.forEach((ev, i) => {
      ev.ts = at + i * 10;
      if (ev.type === 'room.transfer_posted')
        ev.data = { ...ev.data, computeMicros: prefillMs * 1000 };
      if (ev.type === 'room.completed') ev.data = { ...ev.data, computeMicros: decodeMs * 1000 };
      out.push(ev);
    });
  }
  return out;
}

describe('planner replay of a journal', () => {
  it('heads prefill-heavy traffic to more prefill engines and decode-heavy to more decode, holding through the gap', async () => {
    const journal = await SqliteJournal.open({ path: `${dir}/j.db` });
    try {
      for (const [e, role] of [
        ['p0', 'prefill'],
        ['p1', 'prefill'],
        ['d0', 'decode'],
        ['d1', 'decode'],
      ] as const)
        await journal.append({
          type: 'engine.registered',
          engine: e,
          source: e,
          ts: T0 - 1000,
          data: { role, incarnation: '1' },
        });
      // 2.6 engine-seconds of prefill a second, 0.3 of decode; then an hour of nothing; then the reverse.
      // Appended without waiting for each: one group commit takes many, in the order given.
      const events = [...phase(T0, 6, 2600, 300), ...phase(T0 + 66 * MIN, 6, 300, 2600)];
      const outcomes = await Promise.all(events.map((ev) => journal.append(ev)));
      expect(outcomes.filter((o) => o.status !== 'applied')).toEqual([]);
      const ds: Decision[] = [];
      const n = await replayPlanner(eventPages(journal, { type: [...PLANNER_EVENTS] }), {
        intervalMs: MIN,
        budget: null,
        config: PLANNER_DEFAULTS,
        onDecision: (d) => ds.push(d),
      });
      expect(n).toBe(ds.length);
      const at = (m: number) => ds.find((d) => d.window.from === T0 + m * MIN) as Decision;
      // Budget: the largest fleet the journal showed. The fleet stays 2/2 (nobody acts on a replay).
      expect(at(0).fleet).toEqual({ prefill: 2, decode: 2 });
      expect(at(0).inputs.load.prefill).toBeCloseTo(2.6, 1);
      expect(at(0).inputs.load.decode).toBeCloseTo(0.3, 1);
      expect(at(0).inputs.arrivalsPerS).toBeCloseTo(1, 1);
      expect(at(0).inputs.outputTokens.p50).toBe(8);
      expect([at(0).reason, at(1).reason]).toEqual(['waiting', 'rebalance_to_prefill']);
      expect(at(1).proposal).toEqual({ prefill: 3, decode: 1 });
      expect(at(30).reason).toBe('no_traffic');
      expect([at(66).reason, at(67).reason]).toEqual(['waiting', 'rebalance_to_decode']);
      expect(at(67).proposal).toEqual({ prefill: 1, decode: 3 });
      // Every interval from the first event to the last is decided once, in order.
      expect(ds.map((d) => d.window.from)).toEqual(ds.map((_, i) => T0 - MIN + i * MIN));
      // Time to first token from the record: created → decode_started is 70 ms here, plus one
      // inter-token interval (decode_started → completed over 7 tokens after the first).
      expect(at(0).inputs.ttftMs.p50).toBeCloseTo(70 + 10 / 7, 3);
    } finally {
      await journal.close();
    }
  }, 60_000);
});
