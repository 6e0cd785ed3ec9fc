import { describe, expect, it } from 'vitest';
import type { EventData, EventType, JournalEvent } from '../room/events.ts';
import { waitsWithinTtl, withinDeadlines } from './checks.ts';

let seq = 0;
function ev<T extends EventType>(type: T, ts: number, data: EventData<T>): JournalEvent {
  seq++;
  const envelope = { seq, ts, room: 'r1', engine: null, source: 'api', eventId: `e${seq}` };
  return { ...envelope, type, data } as JournalEvent;
}

const created = ev('room.created', 10_000, { prefillEngine: 'p0', decodeEngine: 'd0' });
const failedAt = (ts: number) =>
  ev('room.failed', ts, { reason: 'deadline_exceeded', stage: 'created', detectedBy: 'watchdog' });

describe('withinDeadlines: every room left each state within its deadline', () => {
  it('takes a state left within its deadline and the watchdog’s second', () => {
    expect(withinDeadlines([created, failedAt(10_000 + 2_000 + 900)], [])).toEqual([]);
  });

  it('names a state held past it, unless a window when nothing could fail it overlaps', () => {
    const late = [created, failedAt(10_000 + 2_000 + 1_500)];
    expect(withinDeadlines(late, [])).toEqual([
      expect.objectContaining({
        invariant: 'states_within_deadlines',
        room: 'r1',
        detail: 'created held 3500 ms, its deadline 2000 ms (left by room.failed)',
      }),
    ]);
    expect(withinDeadlines(late, [{ from: 12_000, to: 13_000 }])).toEqual([]);
    expect(withinDeadlines(late, [{ from: 20_000, to: 21_000 }])).toHaveLength(1);
  });
});

describe('waitsWithinTtl: no request waited in the queue past its time-to-live', () => {
  const waited = (waitedMs: number, band?: 'interactive' | 'batch') =>
    ev('room.created', 20_000, {
      prefillEngine: 'p0',
      decodeEngine: 'd0',
      requestId: 'q1',
      waitedMs,
      ...(band ? { band } : {}),
    });

  it('takes a wait up to the band’s time-to-live, and names one past it', () => {
    expect(waitsWithinTtl([created, waited(10_000), waited(60_000, 'batch')])).toEqual([]);
    expect(waitsWithinTtl([waited(10_001)])).toEqual([
      expect.objectContaining({
        invariant: 'waits_within_ttl',
        detail: 'q1 waited 10001 ms for its room, its interactive time-to-live 10000 ms',
      }),
    ]);
    expect(waitsWithinTtl([waited(60_001, 'batch')])).toHaveLength(1);
  });
});
