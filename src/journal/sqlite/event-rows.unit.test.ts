import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { storedData } from './event-rows.ts';

/** In the order the commit queue stores a room.created: the keys rooms repeat last. */
const created = {
  promptTokens: 40,
  sampling: { temperature: 0.7, seed: 12 },
  requestId: 'req-é"1',
  reservation: {
    decode: { pages: [3, 4], pool: '/pdctl-d0-1', epoch: 8772855305855059, incarnation: 'inc-1' },
  },
  prefillEngine: 'p0',
  decodeEngine: 'd0',
  deadlinesMs: { created: 2000, decoding: 600000 },
};

/** What the `events` view reads back: SQLite's own json_patch of the two parts. */
function readBack(s: { data: string; shared: string | null }): string {
  if (s.shared === null) return s.data;
  const db = new Database(':memory:');
  try {
    return db.prepare('SELECT json_patch(?, ?)').pluck().get(s.data, s.shared) as string;
  } finally {
    db.close();
  }
}

describe('storedData', () => {
  it("keeps a room.created's engines, deadline table and reservation identity apart, and SQLite patches them back byte for byte", () => {
    const s = storedData('room.created', created);
    expect(JSON.parse(s.shared as string)).toEqual({
      reservation: {
        decode: { pool: '/pdctl-d0-1', epoch: 8772855305855059, incarnation: 'inc-1' },
      },
      prefillEngine: 'p0',
      decodeEngine: 'd0',
      deadlinesMs: { created: 2000, decoding: 600000 },
    });
    expect(JSON.parse(s.data).reservation).toEqual({ decode: { pages: [3, 4] } });
    expect(readBack(s)).toBe(JSON.stringify(created));
  });

  it("splits a room.bootstrapped's pool and epoch", () => {
    const data = { pages: [1], pool: '/pdctl-d0-1', epoch: 7 };
    const s = storedData('room.bootstrapped', data);
    expect(s).toEqual({ data: '{"pages":[1]}', shared: '{"pool":"/pdctl-d0-1","epoch":7}' });
    expect(readBack(s)).toBe(JSON.stringify(data));
  });

  it("splits the shared keys an event has, written last, and a transfer's transport and a finish reason", () => {
    const { prefillEngine, decodeEngine, deadlinesMs, ...own } = created;
    const noReservation = { promptTokens: 3, prefillEngine, decodeEngine, deadlinesMs };
    const canonical = { ...own, prefillEngine, decodeEngine, model: 'm', deadlinesMs };
    for (const [type, data, rest] of [
      ['room.created', noReservation, '{"promptTokens":3}'],
      [
        'room.created',
        canonical,
        JSON.stringify({ ...own, reservation: { decode: { pages: [3, 4] } } }),
      ],
      [
        'room.transfer_completed',
        { bytes: 1, checksum: 'ab', transport: 'shm' },
        '{"bytes":1,"checksum":"ab"}',
      ],
      ['room.completed', { tokens: 8, finishReason: 'stop' }, '{"tokens":8}'],
    ] as const) {
      const s = storedData(type, data);
      expect(s.data, type).toBe(rest);
      expect(readBack(s), type).toBe(JSON.stringify(data));
    }
  });

  it('stores whole what a patch could not give back in the same order, or that lacks a shared key', () => {
    const { deadlinesMs, ...rest } = created;
    const reordered = { deadlinesMs, ...rest }; // the table first: a patch would append it last
    const enginesFirst = { prefillEngine: 'p0', promptTokens: 1, deadlinesMs }; // as before December
    for (const [type, data] of [
      ['room.created', reordered],
      ['room.created', enginesFirst],
      ['room.created', { promptTokens: 3 }],
      ['room.bootstrapped', { pages: [1] }],
      ['room.completed', { tokens: 8 }],
      ['room.completed', { finishReason: 'stop', tokens: 8 }],
    ] as const) {
      expect(storedData(type, data), type).toEqual({ data: JSON.stringify(data), shared: null });
    }
  });

  it('gives back the text appended, as SQLite patches it, whatever the order and values of the keys', () => {
    // Shuffled keys at both levels the split takes from, some left out, a null where a patch would
    // delete it: whichever way storedData decides, SQLite's json_patch reads back the appended text.
    let state = 7;
    const next = () => {
      state = (state * 1103515245 + 12345) % 2 ** 31;
      return state / 2 ** 31;
    };
    const shuffled = (o: Record<string, unknown>) => {
      const mix = next() > 0.5; // else in the order given: the shared keys last
      return Object.fromEntries(
        Object.entries(o)
          .filter(() => next() > 0.15)
          .sort(() => (mix ? next() - 0.5 : 0)),
      );
    };
    let split = 0;
    for (let i = 0; i < 300; i++) {
      const decode = shuffled({ pages: [i], pool: '/p', epoch: i, incarnation: 'x' });
      const { prefillEngine, decodeEngine, deadlinesMs, ...own } = created;
      const data = shuffled({
        ...own,
        reservation: { decode },
        prefillEngine,
        decodeEngine,
        model: next() > 0.9 ? null : 'm',
        transport: 'shm',
        deadlinesMs: next() > 0.9 ? { created: null } : deadlinesMs,
      });
      const s = storedData('room.created', data);
      if (s.shared !== null) split++;
      expect(readBack(s), JSON.stringify(data)).toBe(JSON.stringify(data));
    }
    expect(split).toBeGreaterThan(30); // the draw does reach the split, not only whole rows
  });
});
