import { describe, expect, it } from 'vitest';
import { validateEvent } from '../room/events.ts';
import { isFailureReason } from '../room/reasons.ts';
import { fold, type ReducibleEvent } from '../room/reducer.ts';
import { synthEvents } from './synth.ts';

const options = {
  rooms: 600,
  seed: 5,
  spanMs: 600_000,
  endTs: 1_800_000_000_000,
  prefill: ['p0', 'p1'],
  decode: ['d0', 'd1'],
  incidents: 2,
};

describe('synthEvents', () => {
  const events = [...synthEvents(options)];

  it('yields valid events in time order, ending at the end of the span', () => {
    for (const ev of events) expect(() => validateEvent(ev)).not.toThrow();
    const ts = events.map((e) => e.ts as number);
    expect(ts).toEqual([...ts].sort((a, b) => a - b));
    expect(Math.max(...ts)).toBeLessThanOrEqual(options.endTs);
  });

  it('is deterministic for a seed, apart from room ids', () => {
    const again = [...synthEvents(options)];
    const shape = (e: (typeof events)[number]) => [
      e.type,
      e.ts,
      e.engine,
      JSON.stringify(e.data).replace(/r-[a-z0-9]+-[0-9a-f]+/g, 'R'),
    ];
    expect(again.map(shape)).toEqual(events.map(shape));
  });

  it('stages engine stalls whose rooms fail when the watchdog steps in, and folds cleanly', () => {
    expect(events.filter((e) => e.type === 'engine.stalled')).toHaveLength(2);
    const withSeq = events.map((e, i) => ({
      seq: i + 1,
      ts: e.ts as number,
      type: e.type,
      room: e.room ?? null,
      engine: e.engine ?? null,
      data: e.data,
    })) as ReducibleEvent[];
    const { rooms, inconsistent } = fold(withSeq);
    // Late AbortReqs after completion are the only events that do not apply, as in real races.
    const late = inconsistent.map((x) => events[x.seq - 1]?.type);
    expect(new Set(late)).toEqual(late.length ? new Set(['room.abort_requested']) : new Set());
    // The stalled engines' rooms outstayed their deadlines, and the watchdog failed them.
    const stalled = new Set(events.filter((e) => e.type === 'engine.stalled').map((e) => e.engine));
    const caught = [...rooms.values()].filter(
      (r) =>
        r.reason === 'deadline_exceeded' &&
        (stalled.has(r.prefillEngine) || stalled.has(r.decodeEngine)),
    );
    expect(caught.length).toBeGreaterThan(0);
    for (const r of caught) expect(r.detectedBy).toBe('watchdog');
    // Every failure is one of the list of reasons.
    for (const r of rooms.values())
      if (r.state === 'failed') expect(isFailureReason(r.reason), String(r.reason)).toBe(true);
  });
});
