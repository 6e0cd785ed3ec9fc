import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { storedData } from './event-rows.ts';

const created = {
  prefillEngine: 'p0',
  decodeEngine: 'd0',
  promptTokens: 40,
  sampling: { temperature: 0.7, seed: 12 },
  requestId: 'req-é"1',
  reservation: {
    decode: { pages: [3, 4], pool: '/pdctl-d0-1', epoch: 8772855305855059, incarnation: 'inc-1' },
  },
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
  it("keeps a room.created's deadline table and reservation identity apart, and SQLite patches them back byte for byte", () => {
    const s = storedData('room.created', created);
    expect(JSON.parse(s.shared as string)).toEqual({
      reservation: {
        decode: { pool: '/pdctl-d0-1', epoch: 8772855305855059, incarnation: 'inc-1' },
      },
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

  it('stores whole what a patch could not give back in the same order, or that lacks a shared key', () => {
    const { deadlinesMs, ...rest } = created;
    const reordered = { deadlinesMs, ...rest }; // the table first: a patch would append it last
    const noReservation = { prefillEngine: 'p0', decodeEngine: 'd0', deadlinesMs };
    for (const [type, data] of [
      ['room.created', reordered],
      ['room.created', noReservation],
      ['room.bootstrapped', { pages: [1] }],
      ['room.completed', { tokens: 8 }],
    ] as const) {
      expect(storedData(type, data), type).toEqual({ data: JSON.stringify(data), shared: null });
    }
  });
});
