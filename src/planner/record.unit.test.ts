/** The planner's record of an interval, folded from committed events. */
import { describe, expect, it } from 'vitest';
import { completedRoomEvents } from '../journal/synth.ts';
import type { JournalEvent, JournalEventOf } from '../room/events.ts';
import { WindowRecord } from './record.ts';

/** A room's ten events as committed from `at`, 10 ms apart, from the given source. */
function committed(room: string, at: number, source = 'api'): JournalEvent[] {
  return completedRoomEvents(room, 'p0', 'd0', source).map(
    (ev, i) =>
      ({ seq: 0, eventId: '', engine: null, room, ...ev, ts: at + i * 10 }) as JournalEvent,
  );
}

describe('planner record', () => {
  it('estimates time to first token and inter-token latency from the events, and leaves the canary out', () => {
    const record = new WindowRecord(0);
    for (const ev of committed('r-1', 1000)) record.fold(ev);
    for (const ev of committed('r-canary', 2000, 'canary')) record.fold(ev);
    const s = record.close(60_000);
    expect(s.arrivalsPerS).toBeCloseTo(1 / 60, 6);
    expect(s.promptTokens).toEqual({ count: 1, p50: 512, p90: 512, p99: 512 });
    expect(s.outputTokens.count).toBe(1);
    // created at +0, decode_started at +70, completed at +80 with 8 tokens: 10 ms over 7 gaps.
    expect(s.itlMs.p50).toBeCloseTo(10 / 7, 9);
    expect(s.ttftMs.p50).toBeCloseTo(70 + 10 / 7, 9);
    // No computeMicros: the prefill's work is prefill_started → transfer_posted (10 ms).
    expect(s.load.prefill).toBeCloseTo(0.01 / 60, 9);
    const next = record.close(120_000);
    expect([next.arrivalsPerS, next.outputTokens.count]).toEqual([0, 0]);
  });

  it('counts engines by role from registration to exit', () => {
    const record = new WindowRecord(0);
    const ev = (type: string, engine: string, data: unknown) =>
      ({
        seq: 0,
        ts: 1,
        room: null,
        engine,
        source: engine,
        eventId: '',
        type,
        data,
      }) as JournalEvent;
    record.fold(ev('engine.registered', 'p0', { role: 'prefill', incarnation: '1' }));
    record.fold(ev('engine.registered', 'p1', { role: 'prefill', incarnation: '1' }));
    record.fold(ev('engine.registered', 'd0', { role: 'decode', incarnation: '1' }));
    record.fold(
      ev('engine.exited', 'p1', {
        pid: 1,
        code: 0,
        signal: null,
        rooms: 0,
        restarts: 0,
        expected: true,
      }),
    );
    expect(record.engines()).toEqual({ prefill: 1, decode: 1 });
  });

  it('counts the load the arrivals bring, not only what completed: an overloaded role looks short, not busy', () => {
    const record = new WindowRecord(0);
    // Ten rooms arrive; one completes (its decode took 10 ms); nine wait behind it.
    const evs = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9].flatMap((i) => committed(`r-${i}`, 1000 + i));
    for (const ev of evs) if (ev.type === 'room.created' || ev.room === 'r-0') record.fold(ev);
    const s = record.close(10_000);
    expect(s.outputTokens.count).toBe(1);
    expect(s.load.decode).toBeCloseTo((10 * 0.01) / 10, 9);
    // The next window: nothing arrives, two complete: what was done counts.
    for (const ev of evs)
      if (ev.room === 'r-1' || ev.room === 'r-2') if (ev.type !== 'room.created') record.fold(ev);
    expect(record.close(20_000).load.decode).toBeCloseTo((2 * 0.01) / 10, 9);
  });

  it('prices arrivals by what they ask for: longer prompts and answers weigh at once, before any of them finishes', () => {
    const record = new WindowRecord(0);
    // One room finishes: 512 prompt tokens in 10 ms of prefill, 8 tokens (all it asked for) in 10 ms of decode.
    for (const ev of committed('r-0', 1000)) record.fold(ev);
    record.close(10_000);
    // Ten arrive with four times the prompt and eight times the answer; none finishes yet.
    for (let i = 1; i <= 10; i++) {
      const created = committed(`r-${i}`, 11_000 + i)[0] as JournalEventOf<'room.created'>;
      record.fold({ ...created, data: { ...created.data, promptTokens: 2048, maxTokens: 64 } });
    }
    const s = record.close(20_000);
    expect(s.load.prefill).toBeCloseTo((10 * 4 * 0.01) / 10, 9);
    expect(s.load.decode).toBeCloseTo((10 * 8 * 0.01) / 10, 9);
  });

  it('reads the queue: requests waiting for their turn are load as arrivals are, though they have no room yet', () => {
    const record = new WindowRecord(0);
    for (const ev of committed('r-0', 1000)) record.fold(ev);
    record.close(10_000);
    // Nothing arrives as a room; ten wait in flow control's queue, as the first room was shaped.
    const queued = Array.from({ length: 10 }, () => ({ promptTokens: 512, maxTokens: 8 }));
    const idle = record.close(20_000);
    const s = record.close(30_000, queued);
    expect(idle.load).toEqual({ prefill: 0, decode: 0 });
    expect(s.queued).toBe(10);
    expect(s.load.prefill).toBeCloseTo((10 * 0.01) / 10, 9);
    expect(s.load.decode).toBeCloseTo((10 * 0.01) / 10, 9);
  });
});
