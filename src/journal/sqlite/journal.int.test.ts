import { chmodSync, closeSync, existsSync, openSync, statSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import Database from 'better-sqlite3';
import { describe, expect, it, vi } from 'vitest';
import { created } from '../../../test/helpers/events.ts';
import { journalContract } from '../../../test/helpers/journal-contract.ts';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { silentLogger } from '../../log.ts';
import type { SqliteFaults } from './faults.ts';
import { SqliteJournal } from './journal.ts';

const dir = tempDir('pdctl-journal-');
let n = 0;
const fresh = (opts: Partial<Parameters<typeof SqliteJournal.open>[0]> = {}) =>
  SqliteJournal.open({ path: `${dir}/j${n++}.db`, faults: true, ...opts });

/** The fault hooks of a journal opened with them. */
function hooks(j: SqliteJournal): SqliteFaults {
  if (!j.faults) throw new Error('opened without its fault hooks');
  return j.faults;
}

journalContract({
  name: 'SQLite',
  fresh,
  place: async () => `${dir}/j${n++}.db`,
  open: (path) => SqliteJournal.open({ path }),
  async countCommitted(j, seq) {
    const other = new Database((j as SqliteJournal).path, { readonly: true });
    try {
      return other.prepare('SELECT count(*) FROM events WHERE seq <= ?').pluck().get(seq) as number;
    } finally {
      other.close();
    }
  },
});

describe('SqliteJournal fault hooks', () => {
  it('exist only on a journal opened with them: what serve opens cannot be capped or crashed', async () => {
    const plain = await fresh({ faults: false });
    try {
      expect(plain.faults).toBeNull();
    } finally {
      await plain.drain();
    }
  });
});

describe('SqliteJournal writer supervision', () => {
  it('restarts a crashed writer thread; appends queued meanwhile commit, in-flight ones fail retryably', async () => {
    const j = await fresh({ durability: 'power' });
    try {
      await j.append(created('before-crash'));
      hooks(j).crashWriter();
      const outcomes = await Promise.allSettled(
        Array.from({ length: 50 }, (_, i) => j.append(created(`during-${i}`))),
      );
      for (const o of outcomes) {
        if (o.status === 'rejected')
          expect(o.reason).toMatchObject({ code: 'JOURNAL_WRITE_FAILED' });
      }
      // Whatever failed is retried with the same event id, as an engine would after a reconnect.
      const retry = () =>
        j.append({ ...created('after-crash'), eventId: 'after-crash-1' }).catch((e: unknown) => e);
      const deadline = Date.now() + 10_000;
      let after = await retry();
      while (!(after as { status?: string }).status && Date.now() < deadline) {
        await new Promise((r) => setTimeout(r, 50));
        after = await retry();
      }
      expect(['applied', 'duplicate']).toContain((after as { status: string }).status);
      expect(j.health()).toMatchObject({ state: 'ready', writable: true, writerRestarts: 1 });
      expect((await j.verify()).ok).toBe(true);
      const committed = outcomes.filter((o) => o.status === 'fulfilled').length;
      expect((await j.stats()).rooms).toBe(2 + committed);
    } finally {
      await j.drain();
    }
  });
});

describe('SqliteJournal scanned after it opens (a big file at serve)', () => {
  /** A journal of 300 rooms, closed whole (its WAL checkpointed away). */
  const filled = async () => {
    const j = await fresh();
    for (let i = 0; i < 300; i++) await j.append(created(`r${i}`));
    await j.drain();
    return j.path;
  };
  const warnings: string[] = [];
  const notes: string[] = [];
  const log = {
    ...silentLogger,
    info: (_o: object, m: string) => notes.push(m),
    error: (_o: object, m: string) => warnings.push(m),
  };

  it('serves a whole file at once and finds it whole', async () => {
    const j = await SqliteJournal.open({ path: await filled(), scanLaterAbove: 0, logger: log });
    try {
      expect((await j.append(created('after'))).status).toBe('applied');
      await vi.waitFor(() => expect(notes).toContain('journal quick_check passed (after start)'), {
        timeout: 10_000,
      });
      expect(j.health()).toMatchObject({ writable: true, lastError: null });
      expect((await j.append(created('after-scan'))).status).toBe('applied');
    } finally {
      await j.drain();
    }
  });

  it('waits with the scan for scanNow() when asked to wait, and scans once', async () => {
    const j = await SqliteJournal.open({
      path: await filled(),
      scanLaterAbove: 0,
      scanAfterMs: 600_000,
      logger: log,
    });
    try {
      const passed = () => notes.filter((m) => m === 'journal quick_check passed (after start)');
      const before = passed().length;
      expect((await j.append(created('waiting'))).status).toBe('applied');
      await new Promise((r) => setTimeout(r, 300));
      expect(passed().length).toBe(before);
      j.scanNow();
      j.scanNow();
      await vi.waitFor(() => expect(passed().length).toBe(before + 1), { timeout: 10_000 });
      await new Promise((r) => setTimeout(r, 300));
      expect(passed().length).toBe(before + 1);
    } finally {
      await j.drain();
    }
  });

  it('stops writing to a file the scan finds damaged, and says why and what to do', async () => {
    const path = await filled();
    // Garbage over the b-tree header of a rooms index: opening and journal.opened never read it.
    const db = new Database(path, { readonly: true });
    const root = db
      .prepare("SELECT rootpage FROM sqlite_master WHERE name = 'rooms_created_at'")
      .pluck()
      .get() as number;
    db.close();
    const fd = openSync(path, 'r+');
    writeSync(fd, Buffer.alloc(64, 0xee), 0, 64, (root - 1) * 4096);
    closeSync(fd);
    const announce = { source: 'control', version: 'test' };
    const j = await SqliteJournal.open({ path, scanLaterAbove: 0, logger: log, announce });
    try {
      await vi.waitFor(() => expect(j.health().writable).toBe(false), { timeout: 10_000 });
      expect(j.health().lastError).toMatch(
        /failed SQLite's quick_check after pdctl started on it .*every write to it is refused.*pdctl journal backup/,
      );
      expect(warnings).toEqual([j.health().lastError]);
      await expect(j.append(created('refused'))).rejects.toMatchObject({
        code: 'JOURNAL_CORRUPT',
      });
      await expect(j.setCursor('watchdog', 1)).rejects.toMatchObject({ code: 'JOURNAL_CORRUPT' });
    } finally {
      await j.drain();
    }
  });
});

describe('SqliteJournal drain', () => {
  it('never hangs: appends the writer cannot finish in time are rejected and the journal closes', async () => {
    const j = await fresh({ durability: 'power' });
    await j.append(created('drain-before'));
    hooks(j).crashWriter();
    // Wait until the thread is gone; its restart waits out a 50 ms back-off first.
    for (let i = 0; i < 500 && j.health().state !== 'starting'; i++)
      await new Promise((r) => setTimeout(r, 2));
    expect(j.health().state).toBe('starting');
    const stuck = j.append(created('drain-stuck'));
    await j.drain({ timeoutMs: 1 });
    await expect(stuck).rejects.toMatchObject({ code: 'JOURNAL_CLOSED' });
    expect(j.health().state).toBe('closed');
    // The lock was released: the journal opens again, and holds what was committed.
    const again = await SqliteJournal.open({ path: j.path });
    expect((await again.timeline('drain-before')).room?.state).toBe('created');
    expect((await again.verify()).ok).toBe(true);
    await again.drain();
  });
});

describe('SqliteJournal when the disk is full', () => {
  it.each(['process', 'power'] as const)(
    '%s: failed commits are refused whole, nothing half-applied, and appends resume when space returns',
    async (durability) => {
      const j = await fresh({ durability });
      try {
        const rooms = Array.from({ length: 20 }, (_, i) => `full-${i}`);
        await Promise.all(rooms.map((r) => j.append(created(r))));
        const pages = (j as unknown as { db: Database.Database }).db.pragma('page_count', {
          simple: true,
        }) as number;
        await hooks(j).limitPages(pages);
        let failure: unknown = null;
        let round = 0;
        // Big payloads until a commit needs a page it cannot have; each round's source is a name
        // event_names has not seen, so the failed batch added one and took it back.
        while (!failure && round < 200) {
          failure = await Promise.all(
            rooms.map((r) =>
              j.append({
                type: 'room.abort_requested',
                room: r,
                source: `test-${round}`,
                data: { reason: `x${round}`.padEnd(400, 'x') },
              }),
            ),
          ).then(
            () => null,
            (e: unknown) => e,
          );
          round++;
        }
        expect(failure).toMatchObject({ code: 'JOURNAL_WRITE_FAILED' });
        expect((failure as Error).message).toMatch(/full/i);
        expect(j.health()).toMatchObject({ writable: false });
        await hooks(j).limitPages(null);
        // The writer's room cache must match the database: the failed batch changed nothing. An
        // abort request now must keep the first committed one's reason, as the fold does.
        // The failed round's source again: its name's id from the failed batch must not be reused.
        const failedSource = `test-${round - 1}`;
        await Promise.all(
          rooms.map((r) =>
            j.append({
              type: 'room.abort_requested',
              room: r,
              source: failedSource,
              data: { reason: 'after' },
            }),
          ),
        );
        const last = (await j.timeline(rooms[0] as string)).events.at(-1);
        expect(last).toMatchObject({ type: 'room.abort_requested', source: failedSource });
        for (const r of rooms) {
          expect(
            await j.append({
              type: 'room.bootstrap_started',
              room: r,
              engine: 'd0',
              source: 'd0',
              data: {},
            }),
          ).toMatchObject({ status: 'applied', state: 'bootstrapping' });
        }
        expect(j.health()).toMatchObject({ writable: true, lastError: null });
        expect((await j.verify()).ok).toBe(true);
      } finally {
        await j.drain();
      }
    },
  );
});

describe('SqliteJournal: a failed commit takes what was handed over behind it', () => {
  // A full disk refuses per page: a big batch fails and a small one after it fits. Committing the
  // small one without the big one would put a room's events out of order for good (an engine's
  // transfer_posted refused, as if its prefill_started never came). Inline writers (process) hold
  // it in the queue; the writer thread (power) already has it, and refuses it by its fence.
  it.each(['process', 'power'] as const)('%s', async (durability) => {
    const j = await fresh({ durability, maxBatch: 64 });
    try {
      const rooms = Array.from({ length: 64 }, (_, i) => `big-${i}`);
      await Promise.all(rooms.map((r) => j.append(created(r))));
      const pages = (j as unknown as { db: Database.Database }).db.pragma('page_count', {
        simple: true,
      }) as number;
      await hooks(j).limitPages(pages + 2);
      const big = rooms.map((r) =>
        j.append({
          type: 'room.abort_requested',
          room: r,
          source: 'test',
          data: { reason: 'x'.padEnd(500, 'x') },
        }),
      );
      const behind = j.append(created('behind'));
      const settled = await Promise.allSettled([...big, behind]);
      for (const o of settled) {
        expect(o).toMatchObject({ status: 'rejected', reason: { code: 'JOURNAL_WRITE_FAILED' } });
      }
      expect((await j.timeline('behind')).room).toBeNull();
      // The small one alone fits: it was refused for what was ahead of it, not for its own size.
      expect(await j.append(created('behind'))).toMatchObject({ status: 'applied' });
      await hooks(j).limitPages(null);
      expect((await j.verify()).ok).toBe(true);
    } finally {
      await j.drain();
    }
  });
});

describe('SqliteJournal compact rows (schema 7)', () => {
  it('reads events with their names through the view, and verify finds an id that names nothing', async () => {
    const j = await fresh();
    const path = j.path;
    try {
      await j.append(created('named-room'));
      await j.append({
        type: 'room.bootstrap_started',
        room: 'named-room',
        engine: 'odd-engine',
        source: 'odd',
        data: {},
      });
      const raw = new Database(path, { readonly: true });
      const [row] = raw
        .prepare(
          "SELECT type, room, engine, source FROM events WHERE room = 'named-room' ORDER BY seq",
        )
        .all() as Array<Record<string, unknown>>;
      raw.close();
      expect(row).toMatchObject({ type: 'room.created', room: 'named-room', source: 'test' });
      // A taken id naming a room the journal never had is refused, and leaves no id for that room.
      await j.append({ ...created('id-room'), eventId: 'taken-id' });
      expect(await j.append({ ...created('other-room'), eventId: 'taken-id' })).toMatchObject({
        status: 'rejected',
        reason: 'event_id_conflict',
      });
      expect((await j.tail({ engine: 'odd-engine' })).map((e) => e.source)).toEqual(['odd']);
      expect((await j.verify()).ok).toBe(true);
    } finally {
      await j.drain();
    }
    const db = new Database(path);
    db.prepare("DELETE FROM event_names WHERE name = 'odd'").run();
    db.prepare("INSERT INTO event_rooms (room) VALUES ('no-events')").run();
    db.close();
    const again = await SqliteJournal.open({ path });
    try {
      const report = await again.verify();
      expect(report.ok).toBe(false);
      expect(report.problems).toEqual(
        expect.arrayContaining([
          '1 events refer to a name, room or shared part that event_names, event_rooms or event_shared lacks',
          '1 rooms of event_rooms have no event',
        ]),
      );
    } finally {
      await again.drain();
    }
  });
});

describe('SqliteJournal data that rooms repeat', () => {
  it("stores a room.created's engines, model, transport and deadlines once, and reads back the text it keeps", async () => {
    const j = await fresh();
    const path = j.path;
    const data = (requestId: string, page: number) => ({
      prefillEngine: 'p0',
      decodeEngine: 'd0',
      promptTokens: 40,
      maxTokens: 8,
      model: 'm-1',
      transport: 'shm' as const,
      sampling: { temperature: 1, seed: page },
      requestId,
      reservation: { decode: { pages: [page], pool: '/pool-d0', epoch: 7, incarnation: 'inc-1' } },
    });
    try {
      for (const [room, page] of [
        ['rep-a', 1],
        ['rep-b', 2],
      ] as const) {
        await j.append({
          type: 'room.created',
          room,
          source: 'test',
          data: data(`req-${room}`, page),
        });
      }
      const raw = new Database(path, { readonly: true });
      const rows = raw
        .prepare(
          `SELECT v.type, v.data AS viewed, e.data AS rest, e.shared FROM events v
             JOIN event_rows e ON e.seq = v.seq WHERE v.room IN ('rep-a', 'rep-b') ORDER BY v.seq`,
        )
        .all() as Array<{ type: string; viewed: string; rest: string; shared: number | null }>;
      raw.close();
      const [a, b] = rows;
      // Stored: the room's own values; both rooms name one shared part.
      expect(JSON.parse(a?.rest as string)).toEqual({
        promptTokens: 40,
        maxTokens: 8,
        sampling: { temperature: 1, seed: 1 },
        requestId: 'req-rep-a',
        reservation: { decode: { pages: [1] } },
      });
      expect(a?.shared).not.toBeNull();
      expect(b?.shared).toBe(a?.shared);
      // Read: whole, the repeated keys last, and what tail gives.
      const viewed = JSON.parse(a?.viewed as string) as Record<string, unknown>;
      expect(viewed).toEqual({ ...data('req-rep-a', 1), deadlinesMs: expect.any(Object) });
      expect(Object.keys(viewed).slice(-5)).toEqual([
        'prefillEngine',
        'decodeEngine',
        'model',
        'transport',
        'deadlinesMs',
      ]);
      const tailed = await j.tail({ room: 'rep-a' });
      expect(tailed.map((e) => JSON.stringify(e.data))).toEqual([a?.viewed]);
      expect((await j.verify()).ok).toBe(true);
    } finally {
      await j.drain();
    }
  });
});

describe('SqliteJournal file modes', () => {
  it("creates its directory 0700 and its files 0600 (SQLite's -wal and -shm follow the file)", async () => {
    const path = `${dir}/private-${n++}/data/journal.db`;
    const j = await SqliteJournal.open({ path });
    try {
      await j.append(created('private-room'));
      const mode = (p: string) => statSync(p).mode & 0o777;
      expect(mode(dirname(path))).toBe(0o700);
      expect(mode(dirname(dirname(path)))).toBe(0o700);
      for (const f of [path, `${path}-wal`, `${path}-shm`])
        expect([f, mode(f)]).toEqual([f, 0o600]);
    } finally {
      await j.close();
    }
  });

  it('reports a journal others can read, with the fix, and leaves its modes as they were', async () => {
    const path = `${dir}/shared-${n++}.db`;
    await (await SqliteJournal.open({ path })).close();
    chmodSync(path, 0o644);
    const warnings: Array<{ obj: object; msg: string }> = [];
    const logger = {
      ...silentLogger,
      warn: (obj: object, msg: string) => warnings.push({ obj, msg }),
    };
    const j = await SqliteJournal.open({ path, logger });
    try {
      const w = warnings.find((x) => x.msg.includes('readable by other users'));
      expect(w?.msg).toContain(`chmod 600 ${path}`);
      // SQLite gave the -wal and -shm it made on this open the file's mode.
      expect(w?.obj).toMatchObject({
        readableByOthers: [`${path} (0644)`, `${path}-wal (0644)`, `${path}-shm (0644)`],
      });
      expect(statSync(path).mode & 0o777).toBe(0o644);
    } finally {
      await j.close();
    }
    // The fix it gave, as an operator runs it (a -wal or -shm left by a connection that closed
    // last, a background scan's, is in it too).
    for (const f of [path, `${path}-wal`, `${path}-shm`]) if (existsSync(f)) chmodSync(f, 0o600);
    warnings.length = 0;
    await (await SqliteJournal.open({ path, logger })).close();
    expect(warnings.filter((x) => x.msg.includes('readable by other users'))).toEqual([]);
  });
});
