/**
 * Packed rooms on a real journal file: every read gives what it gave before the rooms were packed,
 * `journal verify` rebuilds the projections from the packs, and what comes after packing — a
 * retried append, a late event, retention — behaves.
 */
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { lifecycle } from '../../../../test/helpers/events.ts';
import { appendsAfterPacking, pruneAfterPacking } from '../../../../test/helpers/pack-cases.ts';
import { END, packTestEvents, reads } from '../../../../test/helpers/pack-reads.ts';
import { tempDir } from '../../../../test/helpers/tmp.ts';
import { PACK_SPAN_MS } from '../../packs.ts';
import { SqliteJournal } from '../journal.ts';

const dir = tempDir('pdctl-packs-');
let n = 0;

async function synthJournal(rooms: number): Promise<SqliteJournal> {
  const j = await SqliteJournal.open({
    path: `${dir}/j${n++}.db`,
    durability: 'process',
  });
  await Promise.all(packTestEvents(rooms).map((ev) => j.append(ev)));
  return j;
}

function count(j: SqliteJournal, sql: string): number {
  const db = new Database(j.path, { readonly: true });
  try {
    return db.prepare(sql).pluck().get() as number;
  } finally {
    db.close();
  }
}

/** Every row of the view, as plain SQL reads it (event ids as hex). */
function viewRows(j: SqliteJournal): unknown[] {
  const db = new Database(j.path, { readonly: true });
  try {
    return db
      .prepare(
        'SELECT seq, ts, type, room, engine, source, hex(event_id), data FROM events ORDER BY seq',
      )
      .raw()
      .all();
  } finally {
    db.close();
  }
}

describe('packed rooms', () => {
  it('reads every event as before packing, through every read, and verify rebuilds from packs', async () => {
    const j = await synthJournal(400);
    try {
      const before = await reads(j);
      const viewBefore = viewRows(j);
      const rowsBefore = count(j, 'SELECT count(*) FROM event_rows');
      const packed = await j.pack(END);
      expect(packed.rooms).toBeGreaterThan(350);
      expect(packed.events).toBeGreaterThan(3000);
      expect(count(j, 'SELECT count(*) FROM event_rows')).toBe(rowsBefore - packed.events);
      expect(count(j, 'SELECT count(*) FROM event_rooms')).toBeLessThan(50);
      expect(await reads(j)).toEqual(before);
      // The view gives back every column of every event as it was, byte for byte.
      expect(viewRows(j)).toEqual(viewBefore);
      const report = await j.verify();
      expect(report.problems).toEqual([]);
      expect(report.ok).toBe(true);
      // A second run finds nothing left to pack. A room appended after one that began after the
      // cut-off, though it ended before (a clock behind): a quick run stops at the first, a whole
      // run packs it.
      expect((await j.pack(END)).rooms).toBe(0);
      for (const ev of lifecycle('began-later')) await j.append({ ...ev, ts: END + 3_600_000 });
      for (const ev of lifecycle('ended-earlier')) await j.append({ ...ev, ts: END - 86_400_000 });
      expect((await j.pack(END, { quick: true })).rooms).toBe(0);
      expect(await j.pack(END)).toEqual({ rooms: 1, events: lifecycle('x').length, skipped: 0 });
      expect(count(j, "SELECT count(*) FROM event_rooms WHERE room = 'began-later'")).toBe(1);
    } finally {
      await j.drain();
    }
  });

  it('takes appends to a packed room after it: a retry is refused as late, a new event is a row of the room', async () => {
    const j = await synthJournal(50);
    try {
      await appendsAfterPacking(j, () => {
        expect(count(j, "SELECT count(*) FROM event_rooms WHERE room = 'late-room'")).toBe(0);
      });
    } finally {
      await j.drain();
    }
  });

  it('splits a room whose events span more than a pack may, and leaves rooms it cannot give back as rows', async () => {
    const j = await synthJournal(20);
    try {
      const slow = lifecycle('slow-room').map((ev, i) => ({
        ...ev,
        ts: END - 10 * PACK_SPAN_MS + i * (PACK_SPAN_MS / 2),
      }));
      for (const ev of slow) await j.append(ev);
      for (const ev of lifecycle('odd-room')) await j.append({ ...ev, ts: END - 1000 });
      // Ids of every form: text ids (as aborts' and migrations' are) pack beside UUID keys, one
      // of 16 bytes among them (its key is 17 bytes long, as a UUID's is).
      const texts = lifecycle('text-ids').map((ev, i) => ({
        ...ev,
        ts: END - 500,
        ...(i % 3 === 0 ? { eventId: `text-ids:step-${i}-é` } : {}),
        ...(i === 1 ? { eventId: 'text-ids:sixteen' } : {}),
      }));
      for (const ev of texts) await j.append(ev);
      const before = await reads(j);
      const viewBefore = viewRows(j);
      // Data that SQLite gives back other than stored (spaces; pdctl writes none such).
      const db = new Database(j.path);
      db.prepare(
        `UPDATE event_rows SET data = '{ "pages": 4 }' WHERE seq =
           (SELECT max(e.seq) FROM event_rows e JOIN event_rooms k ON k.id = e.room WHERE k.room = 'odd-room')`,
      ).run();
      db.close();
      const oddBefore = await j.timeline('odd-room');
      const slowBefore = await j.timeline('slow-room');
      const packed = await j.pack(END);
      expect(packed.skipped).toBe(1);
      expect(
        count(
          j,
          "SELECT count(*) FROM room_packs WHERE room = (SELECT id FROM rooms WHERE room = 'slow-room')",
        ),
      ).toBeGreaterThan(2);
      expect(count(j, "SELECT count(*) FROM event_rooms WHERE room = 'odd-room'")).toBe(1);
      const after = await reads(j);
      expect(after.all.filter((e) => e.room !== 'odd-room')).toEqual(
        before.all.filter((e) => e.room !== 'odd-room'),
      );
      // The view too, the packed ids of every form included.
      const notOdd = (rows: unknown[]) => rows.filter((r) => (r as unknown[])[3] !== 'odd-room');
      expect(notOdd(viewRows(j))).toEqual(notOdd(viewBefore));
      expect(await j.timeline('slow-room')).toEqual(slowBefore);
      expect(slowBefore.events.map((e) => e.ts)).toEqual(slow.map((e) => e.ts));
      expect(await j.timeline('odd-room')).toEqual(oddBefore);
      expect(count(j, "SELECT count(*) FROM event_rooms WHERE room = 'text-ids'")).toBe(0);
      const ids = (await j.timeline('text-ids')).events.map((e) => e.eventId);
      expect(ids).toContain('text-ids:step-3-é');
      expect(ids).toContain('text-ids:sixteen');
      expect((await j.verify()).problems).toEqual([]);
    } finally {
      await j.drain();
    }
  });

  it('prunes packed rooms with their packs, counting their events as before', async () => {
    const j = await synthJournal(200);
    try {
      await pruneAfterPacking(j, {
        orphans: () =>
          count(
            j,
            'SELECT count(*) FROM room_packs p WHERE NOT EXISTS (SELECT 1 FROM rooms WHERE id = p.room)',
          ),
        packs: () => count(j, 'SELECT count(*) FROM room_packs'),
      });
    } finally {
      await j.drain();
    }
  });

  it('packs on its own while open, rooms that ended long enough ago only, and closes cleanly while at it', async () => {
    const j = await SqliteJournal.open({
      path: `${dir}/j${n++}.db`,
      durability: 'process',
      packAfterMs: 60_000,
      packEveryMs: 20,
    });
    try {
      for (let i = 0; i < 40; i++) {
        for (const ev of lifecycle(`old-${i}`)) await j.append({ ...ev, ts: END + i });
      }
      for (const ev of lifecycle('just-ended')) await j.append(ev);
      // Rooms, not packs: a room's last release may come after a pack of its earlier events
      // (these rooms "ended" long before they were appended), and goes into a pack of its own.
      const packed = () => count(j, 'SELECT count(DISTINCT room) FROM room_packs');
      for (let waited = 0; packed() < 40 && waited < 10_000; waited += 20) {
        await new Promise((r) => setTimeout(r, 20));
      }
      expect(packed()).toBe(40);
      expect(count(j, "SELECT count(*) FROM event_rooms WHERE room = 'just-ended'")).toBe(1);
      // Appends and packing side by side, then a drain in the middle of it.
      const late = Array.from({ length: 30 }, (_, i) =>
        lifecycle(`late-${i}`).map((ev) => j.append({ ...ev, ts: END })),
      ).flat();
      expect((await Promise.all(late)).every((r) => r.status === 'applied')).toBe(true);
    } finally {
      await j.drain();
    }
    const reader = await SqliteJournal.open({ path: j.path, durability: 'process' });
    try {
      expect((await reader.verify()).problems).toEqual([]);
      expect((await reader.timeline('old-3')).events).toHaveLength(lifecycle('x').length);
    } finally {
      await reader.drain();
    }
  });

  it('verify names a pack that is damaged, names no room, or refers to a name that is missing', async () => {
    const j = await synthJournal(30);
    try {
      await j.pack(END);
      expect((await j.verify()).problems).toEqual([]);
      const db = new Database(j.path);
      const [a, b, c] = db
        .prepare('SELECT first_seq FROM room_packs ORDER BY first_seq LIMIT 3')
        .pluck()
        .all() as number[];
      db.prepare("UPDATE room_packs SET events = '[[0,0' WHERE first_seq = ?").run(a);
      db.prepare(
        "UPDATE room_packs SET events = json_replace(events, '$[0][2]', 999) WHERE first_seq = ?",
      ).run(b);
      db.prepare('UPDATE room_packs SET room = 999999 WHERE first_seq = ?').run(c);
      db.close();
      const problems = (await j.verify()).problems;
      expect(problems).toContain('1 packs of room_packs name no row of rooms');
      expect(problems).toContain(
        `1 packs of room_packs are damaged (not JSON, keys missing, or a seq outside their bounds), first at seq ${a}`,
      );
      expect(problems).toContain(
        `1 packs of room_packs refer to a shape, name or shared part that event_shapes, event_names or event_shared lacks, first at seq ${b}`,
      );
    } finally {
      await j.drain();
    }
  });
});
