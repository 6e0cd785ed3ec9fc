/**
 * Packed rooms on a real PostgreSQL journal: every read gives what it gave before the rooms were
 * packed, the view gives back every column byte for byte, `journal verify` rebuilds the
 * projections from the packs, and retention takes packed rooms whole.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { lifecycle } from '../../../../test/helpers/events.ts';
import { appendsAfterPacking, pruneAfterPacking } from '../../../../test/helpers/pack-cases.ts';
import { END, packTestEvents, reads } from '../../../../test/helpers/pack-reads.ts';
import { freshDatabase, havePostgres } from '../../../../test/helpers/postgres.ts';
import { openJournalReader } from '../../../app/journal.ts';
import type { EventInput } from '../../../room/events.ts';
import { PACK_SPAN_MS } from '../../packs.ts';
import { PgJournal } from '../journal.ts';
import { pgMigrate, pgMigrations } from '../migrate.ts';

const enabled = havePostgres();

async function sql<R extends pg.QueryResultRow>(url: string, text: string): Promise<R[]> {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return (await c.query<R>(text)).rows;
  } finally {
    await c.end();
  }
}

const count = async (url: string, text: string) =>
  Number((await sql<{ n: string }>(url, text))[0]?.n);

/** Every row of the view, as plain SQL reads it (event ids as hex). */
const viewRows = (url: string) =>
  sql(
    url,
    `SELECT seq, ts, type, room, engine, source, encode(event_id, 'hex') AS id, data, term
       FROM events ORDER BY seq`,
  );

async function synthJournal(
  rooms: number,
  opts: { packAfterMs?: number; packEveryMs?: number } = {},
) {
  const url = await freshDatabase();
  const j = await PgJournal.open({ url, durability: 'process', ...opts });
  await Promise.all(packTestEvents(rooms).map((ev) => j.append(ev)));
  return { j, url };
}

describe.runIf(enabled)('packed rooms on PostgreSQL', () => {
  it('reads every event as before packing, through every read and the view, and verify rebuilds from packs', async () => {
    const { j, url } = await synthJournal(300);
    try {
      // A room split across packs, and event ids of every form (text ids beside UUID keys).
      const slow = lifecycle('slow-room').map((ev, i) => ({
        ...ev,
        ts: END - 10 * PACK_SPAN_MS + i * (PACK_SPAN_MS / 2),
      }));
      for (const ev of slow) await j.append(ev);
      const texts = lifecycle('text-ids').map((ev, i) => ({
        ...ev,
        ts: END - 500,
        ...(i % 3 === 0 ? { eventId: `text-ids:step-${i}-é` } : {}),
        ...(i === 1 ? { eventId: 'text-ids:sixteen' } : {}),
      }));
      for (const ev of texts) await j.append(ev);
      // A room.created whose reservation identity is shared too (a suffix inside two objects).
      const reserved = lifecycle('reserved').map((ev, i) => ({
        ...ev,
        ts: END - 400,
        ...(i === 0
          ? {
              data: {
                ...(ev.data as Record<string, unknown>),
                sampling: { temperature: 1, seed: 7 },
                reservation: {
                  decode: {
                    pages: [2, 3],
                    pool: '/pdctl-decode-0-1',
                    epoch: 9,
                    incarnation: 'i-1',
                  },
                },
              },
            }
          : {}),
      }));
      for (const ev of reserved) await j.append(ev as EventInput);
      // Data whose keys a layout must escape or keep in order (format()'s %, a key that is a
      // number, JSON.stringify escapes), beside data a layout cannot give back (not its order).
      for (const ev of lifecycle('odd-keys')) await j.append({ ...ev, ts: END - 300 });
      const edit = (type: string, data: string) =>
        sql(
          url,
          `UPDATE event_rows SET data = '${data}' WHERE room = 'odd-keys' AND type = '${type}'`,
        );
      await edit(
        'room.prefill_started',
        '{"7":null,"%s":1,"a%%b":"x%sy","é":{"n":[1,{}]},"\\"":"\\n"}',
      );
      await edit('room.bootstrap_started', '{"b":1,"a":2,"7":3}');
      await edit('room.decode_started', '{ "spaced": true }');
      const before = await reads(j);
      const viewBefore = await viewRows(url);
      const rowsBefore = await count(url, 'SELECT count(*) AS n FROM event_rows');
      const packed = await j.pack(END);
      expect(packed.rooms).toBeGreaterThan(250);
      expect(packed.skipped).toBe(0);
      expect(await count(url, 'SELECT count(*) AS n FROM event_rows')).toBe(
        rowsBefore - packed.events,
      );
      expect(
        await count(url, "SELECT count(*) AS n FROM room_packs WHERE room = 'slow-room'"),
      ).toBeGreaterThan(2);
      expect(await reads(j)).toEqual(before);
      expect(await viewRows(url)).toEqual(viewBefore);
      const ids = (await j.timeline('text-ids')).events.map((e) => e.eventId);
      expect(ids).toContain('text-ids:step-3-é');
      expect(ids).toContain('text-ids:sixteen');
      expect(await count(url, 'SELECT count(*) AS n FROM event_suffixes WHERE depth = 3')).toBe(1);
      // Key names are in the shapes' layouts, not in the packs (but where no layout gives it back).
      expect(
        await count(
          url,
          `SELECT count(*) AS n FROM room_packs WHERE events::text LIKE '%"checksum":%'`,
        ),
      ).toBe(0);
      expect(
        await count(
          url,
          'SELECT count(*) AS n FROM room_packs WHERE events::text LIKE \'%"spaced"%\'',
        ),
      ).toBe(1);
      const report = await j.verify();
      expect(report.problems).toEqual([]);
      expect(report.ok).toBe(true);
      // A second run finds nothing left to pack; a quick one after it neither.
      expect((await j.pack(END)).rooms).toBe(0);
      expect((await j.pack(END, { quick: true })).rooms).toBe(0);
      // A room created long before the walk's place (a clock behind): a whole run packs it.
      for (const ev of lifecycle('ended-earlier')) await j.append({ ...ev, ts: END - 86_400_000 });
      expect((await j.pack(END, { quick: true })).rooms).toBe(0);
      expect(await j.pack(END)).toEqual({ rooms: 1, events: lifecycle('x').length, skipped: 0 });
    } finally {
      await j.drain();
    }
  });

  it('vacuums event_rows and room_packs itself after a run that moved many events, not after a small one', async () => {
    const { j, url } = await synthJournal(40);
    try {
      const vacuums = async () =>
        (
          await sql<{ n: string }>(
            url,
            `SELECT vacuum_count AS n FROM pg_stat_user_tables
              WHERE relname IN ('event_rows', 'room_packs') ORDER BY relname`,
          )
        ).map((r) => Number(r.n));
      const before = await vacuums();
      expect(before).toHaveLength(2);
      // Fewer events than PG_VACUUM_AFTER_EVENTS: left to autovacuum.
      expect((await j.pack(END)).events).toBeGreaterThan(0);
      expect(await vacuums()).toEqual(before);
      // A run at the threshold vacuums both tables.
      for (const room of ['late-1', 'late-2'])
        for (const ev of lifecycle(room)) await j.append({ ...ev, ts: END - 3_600_000 });
      const moved = await j.pack(END, { vacuumAfterEvents: 2 * lifecycle('x').length });
      expect(moved).toMatchObject({ rooms: 2, events: 2 * lifecycle('x').length });
      expect(await vacuums()).toEqual(before.map((n) => n + 1));
      expect(
        await count(
          url,
          "SELECT n_dead_tup AS n FROM pg_stat_user_tables WHERE relname = 'event_rows'",
        ),
      ).toBe(0);
    } finally {
      await j.drain();
    }
  });

  it('reads packs schema 6 wrote as before after schema 7, and a reader of schema 6 says to migrate', async () => {
    const url = await freshDatabase();
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    try {
      await pgMigrate(c, url, pgMigrations().slice(0, 6));
    } finally {
      await c.end();
    }
    // A pack as schema 6 wrote it: its shape has no layout, the data is whole.
    await sql(
      url,
      `INSERT INTO event_shapes (type, engine, source, key_tag, term, suffix)
       VALUES ('room.transfer_completed', 'p0', 'p0', 0, 1, NULL)`,
    );
    await sql(
      url,
      `INSERT INTO room_packs (first_seq, room, last_seq, first_ts, last_ts, events, keys)
       VALUES (5, 'r-6', 5, 1000, 1000, '[[0,0,1,{"bytes":4096,"checksum":"7ec18459","micros":8}]]',
               decode(repeat('ab', 16), 'hex'))`,
    );
    const old = openJournalReader(url);
    await expect(old.readFrom(0, 10)).rejects.toMatchObject({
      code: 'JOURNAL_VERSION_CONFLICT',
      message: expect.stringContaining('pdctl journal migrate --journal'),
    });
    old.close();
    const before = await viewRows(url);
    const j = await PgJournal.open({ url });
    try {
      expect(await viewRows(url)).toEqual(before);
      const reader = openJournalReader(url);
      const [packed] = await reader.readFrom(0, 10);
      reader.close();
      expect(packed).toMatchObject({
        seq: 5,
        room: 'r-6',
        data: { bytes: 4096, checksum: '7ec18459', micros: 8 },
      });
    } finally {
      await j.drain();
    }
  });

  it('packs a room whose events two leaders wrote, each event keeping its term', async () => {
    const url = await freshDatabase();
    const events = lifecycle('two-terms').map((ev, i) => ({ ...ev, ts: END - 60_000 + i }));
    const first = await PgJournal.open({ url, durability: 'process' });
    for (const ev of events.slice(0, 4)) await first.append(ev);
    await first.drain();
    const second = await PgJournal.open({ url, durability: 'process' });
    try {
      for (const ev of events.slice(4)) await second.append(ev);
      const before = await viewRows(url);
      expect(new Set(before.map((r) => r.term))).toEqual(new Set(['1', '2']));
      expect(await second.pack(END)).toMatchObject({ rooms: 1, events: events.length });
      expect(await viewRows(url)).toEqual(before);
      expect((await second.verify()).problems).toEqual([]);
    } finally {
      await second.drain();
    }
  });

  it('takes appends to a packed room after it: a retry is refused as late, a new event is a row of the room', async () => {
    const { j } = await synthJournal(30);
    try {
      await appendsAfterPacking(j);
    } finally {
      await j.drain();
    }
  });

  it('prunes packed rooms with their packs, counting their events as before', async () => {
    const { j, url } = await synthJournal(150);
    try {
      await pruneAfterPacking(j, {
        orphans: () =>
          count(
            url,
            'SELECT count(*) AS n FROM room_packs p WHERE NOT EXISTS (SELECT 1 FROM rooms r WHERE r.room = p.room)',
          ),
        packs: () => count(url, 'SELECT count(*) AS n FROM room_packs'),
      });
      // An event inside a pack cannot be deleted by hand; a row still can.
      await expect(
        sql(url, 'DELETE FROM events WHERE seq = (SELECT min(first_seq) FROM room_packs)'),
      ).rejects.toThrow(/packed with its room/);
    } finally {
      await j.drain();
    }
  });

  it('packs on its own while it leads, rooms that ended long enough ago only', async () => {
    const url = await freshDatabase();
    const j = await PgJournal.open({
      url,
      durability: 'process',
      packAfterMs: 60_000,
      packEveryMs: 20,
    });
    try {
      for (let i = 0; i < 40; i++) {
        for (const ev of lifecycle(`old-${i}`)) await j.append({ ...ev, ts: END + i });
      }
      for (const ev of lifecycle('just-ended')) await j.append(ev);
      const packed = () => count(url, 'SELECT count(DISTINCT room) AS n FROM room_packs');
      for (let waited = 0; (await packed()) < 40 && waited < 10_000; waited += 20) {
        await new Promise((r) => setTimeout(r, 20));
      }
      expect(await packed()).toBe(40);
      expect(
        await count(url, "SELECT count(*) AS n FROM event_rows WHERE room = 'just-ended'"),
      ).toBe(lifecycle('x').length);
      const late = Array.from({ length: 20 }, (_, i) =>
        lifecycle(`late-${i}`).map((ev) => j.append({ ...ev, ts: END })),
      ).flat();
      expect((await Promise.all(late)).every((r) => r.status === 'applied')).toBe(true);
    } finally {
      await j.drain();
    }
    const again = await PgJournal.open({ url, durability: 'process' });
    try {
      expect((await again.verify()).problems).toEqual([]);
      expect((await again.timeline('old-3')).events).toHaveLength(lifecycle('x').length);
    } finally {
      await again.drain();
    }
  });

  it('verify names a pack that is damaged, names no room, or refers to a shape that is missing', async () => {
    const { j, url } = await synthJournal(20);
    try {
      await j.pack(END);
      expect((await j.verify()).problems).toEqual([]);
      const [a, b, c] = (
        await sql<{ first_seq: string }>(
          url,
          'SELECT first_seq FROM room_packs ORDER BY first_seq LIMIT 3',
        )
      ).map((r) => Number(r.first_seq));
      await sql(url, `UPDATE room_packs SET keys = substring(keys FROM 2) WHERE first_seq = ${a}`);
      await sql(
        url,
        `UPDATE room_packs SET events = replace(events::text, '[0,0,', '[0,0,999,')::json
          WHERE first_seq = ${b}`,
      );
      await sql(url, `UPDATE room_packs SET room = 'no-such-room' WHERE first_seq = ${c}`);
      const problems = (await j.verify()).problems;
      expect(problems).toContain('1 packs of room_packs name no row of rooms');
      expect(problems).toContain(
        `1 packs of room_packs are damaged (keys missing, or a seq outside their bounds), first at seq ${a}`,
      );
      expect(problems).toContain(
        `1 packs of room_packs refer to a shape or suffix that event_shapes or event_suffixes lacks, first at seq ${b}`,
      );
    } finally {
      await j.drain();
    }
  });
});
