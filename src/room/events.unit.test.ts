import { describe, expect, it } from 'vitest';
import { RoomError } from './errors.ts';
import { validateEvent } from './events.ts';
import { uuidv7 } from './ids.ts';

describe('validateEvent', () => {
  it('fills ts and a time-ordered eventId, and keeps the given ones', () => {
    const before = Date.now();
    const a = validateEvent({
      type: 'engine.lost',
      engine: 'd0',
      source: 'watchdog',
      data: { reason: 'heartbeat_timeout' },
    });
    expect(a.ts).toBeGreaterThanOrEqual(before);
    expect(a.eventId).toMatch(
      /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/,
    );
    const b = validateEvent({
      type: 'engine.lost',
      engine: 'd0',
      source: 'w',
      eventId: 'mine',
      ts: 5,
      data: { reason: 'x' },
    });
    expect([b.eventId, b.ts, b.room]).toEqual(['mine', 5, null]);
  });

  it('lets engine and system events carry extra diagnostic fields, but not room events', () => {
    expect(() =>
      validateEvent({
        type: 'engine.stalled',
        engine: 'p0',
        source: 'w',
        data: { reason: 'loop_frozen', loop: 'bus' },
      }),
    ).not.toThrow();
    expect(() =>
      validateEvent({
        type: 'room.aborted',
        room: 'r',
        source: 'w',
        data: { reason: 'x', source: 'y', extra: true },
      }),
    ).toThrow(/room\.aborted: data\.extra Unexpected property/);
  });

  it.each([
    [
      {
        type: 'room.created',
        room: 'r',
        source: 'x',
        data: { prefillEngine: 'p0', decodeEngine: 'd0' },
        ts: -1,
      },
      /ts must be unix milliseconds/,
    ],
    [
      { type: 'room.created', room: 'r', source: '', data: {} },
      /source must be a non-empty string/,
    ],
    [{ type: 'engine.lost', source: 'x', data: { reason: 'r' } }, /engine is required/],
    [
      {
        type: 'room.failed',
        room: 'r',
        source: 'x',
        data: { reason: 'r', stage: 'sleeping', detectedBy: 'w' },
      },
      /data\.stage/,
    ],
    [
      { type: 'journal.pruned', source: 'x', data: { cutoffTs: 1, rooms: 1, events: 1 } },
      /written by the journal itself/,
    ],
    [
      { type: 'room.created', room: 'r', source: 'x', eventId: '', data: {} },
      /eventId must be a non-empty string/,
    ],
    [null, /event must be an object/],
  ])('refuses %j', (input, message) => {
    let err: unknown;
    try {
      validateEvent(input);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(RoomError);
    expect((err as RoomError).code).toBe('ROOM_INVALID_EVENT');
    expect((err as Error).message).toMatch(message);
  });
});

describe('uuidv7', () => {
  it('sorts in creation order, also within one millisecond', () => {
    const ids = Array.from({ length: 5000 }, () => uuidv7(1_800_000_000_000));
    expect([...ids].sort()).toEqual(ids);
    expect(new Set(ids).size).toBe(ids.length);
  });
});
