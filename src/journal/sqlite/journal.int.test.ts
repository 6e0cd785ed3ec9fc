import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { created, lifecycle } from '../../../test/helpers/events.ts';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { JournalError } from '../errors.ts';
import type { JournalEvent } from '../events.ts';
import { LIVE_STATES } from '../states.ts';
import { originFilter } from '../store.ts';
import { SqliteJournal } from './journal.ts';

const dir = tempDir('pdctl-journal-');
let n = 0;
const fresh = (opts: Partial<Parameters<typeof SqliteJournal.open>[0]> = {}) =>
  SqliteJournal.open({ path: `${dir}/j${n++}.db`, ...opts });

describe('SqliteJournal append', () => {
  it('applies a whole lifecycle, and the rooms projection equals the fold of events', async () => {
    const j = await fresh();
    try {
      const results = [];
      for (const ev of lifecycle('room-a')) results.push(await j.append(ev));
      expect(results.map((r) => r.status)).toEqual(Array(10).fill('applied'));
      expect(results.map((r) => r.seq)).toEqual([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
      const t = await j.timeline('room-a');
      expect(t.room).toMatchObject({
        state: 'completed',
        tokens: 8,
        releasedBy: ['p0', 'd0'],
        lastSeq: 10,
        eventCount: 10,
      });
      // Through every live state in order, then completed.
      expect(t.spans.map((s) => s.state)).toEqual([...LIVE_STATES, 'completed']);
      const v = await j.verify();
      expect(v).toMatchObject({
        ok: true,
        events: 10,
        rooms: 1,
        mismatches: [],
        missing: [],
        extra: [],
      });
    } finally {
      await j.drain();
    }
  });

  it('groups the appends of one event-loop turn into one transaction, and resolves only after COMMIT', async () => {
    const j = await fresh({ durability: 'power' });
    try {
      const before = j.health().commits;
      const promises = Array.from({ length: 300 }, (_, i) => j.append(created(`g-${i}`)));
      const results = await Promise.all(promises);
      expect(j.health().commits - before).toBe(1);
      expect(j.health().lastBatchSize).toBe(300);
      // A separate connection sees every acknowledged event: the acknowledgement came after COMMIT.
      const other = new Database(j.path, { readonly: true });
      const seen = other
        .prepare('SELECT count(*) FROM events WHERE seq <= ?')
        .pluck()
        .get(Math.max(...results.map((r) => r.seq)));
      other.close();
      expect(seen).toBe(300);
    } finally {
      await j.drain();
    }
  });

  it.each(['process', 'power'] as const)(
    'keeps the event loop turning while %s-durability appends run flat out',
    async (durability) => {
      const j = await fresh({ durability });
      try {
        let ticksDuringLoad = 0;
        let loading = true;
        const timer = setInterval(() => {
          if (loading) ticksDuringLoad++;
        }, 1);
        let next = 0;
        await Promise.all(
          Array.from({ length: 256 }, async () => {
            while (next < 20_000) await j.append(created(`busy-${next++}`));
          }),
        );
        loading = false;
        clearInterval(timer);
        // A writer that chained commits in microtasks would starve timers completely.
        expect(ticksDuringLoad).toBeGreaterThan(0);
      } finally {
        await j.drain();
      }
    },
  );

  it('records an event that does not fit as room.event_rejected and never applies it', async () => {
    const j = await fresh();
    try {
      await j.append(created('late'));
      await j.append({
        type: 'room.aborted',
        room: 'late',
        source: 'test',
        data: { reason: 'client_disconnect', source: 'client' },
      });
      const r = await j.append({
        type: 'room.completed',
        room: 'late',
        engine: 'd0',
        source: 'd0',
        data: { tokens: 1, finishReason: 'stop' },
      });
      expect(r).toMatchObject({ status: 'rejected', reason: 'room_terminal', state: 'aborted' });
      const [rejected] = await j.tail({ type: 'room.event_rejected', limit: 1 });
      expect(rejected).toMatchObject({
        seq: r.seq,
        room: 'late',
        data: { eventType: 'room.completed', reason: 'room_terminal', state: 'aborted' },
      });
      expect((await j.timeline('late')).room?.state).toBe('aborted');
      expect((await j.verify()).ok).toBe(true);
    } finally {
      await j.drain();
    }
  });

  it('stores a retried event_id once, for applied and rejected events, across a restart', async () => {
    const path = `${dir}/idem.db`;
    let j = await SqliteJournal.open({ path });
    const first = await j.append({ ...created('idem'), eventId: 'ev-1' });
    const twice = await Promise.all([
      j.append({ ...created('idem'), eventId: 'ev-1' }),
      j.append({ ...created('idem'), eventId: 'ev-1' }),
    ]);
    expect(first.status).toBe('applied');
    expect(twice).toEqual([
      { status: 'duplicate', seq: first.seq, eventId: 'ev-1', original: 'applied' },
      { status: 'duplicate', seq: first.seq, eventId: 'ev-1', original: 'applied' },
    ]);
    const rejected = await j.append({ ...created('idem'), eventId: 'ev-2' });
    expect(rejected.status).toBe('rejected');
    await j.drain();
    j = await SqliteJournal.open({ path });
    try {
      expect(await j.append({ ...created('idem'), eventId: 'ev-1' })).toMatchObject({
        status: 'duplicate',
        seq: first.seq,
        original: 'applied',
      });
      expect(await j.append({ ...created('idem'), eventId: 'ev-2' })).toMatchObject({
        status: 'duplicate',
        seq: rejected.seq,
        original: 'rejected',
      });
      expect((await j.stats()).events).toBe(2);
    } finally {
      await j.drain();
    }
  });

  it('refuses a different event under a taken event_id: never a duplicate, nothing written', async () => {
    const j = await fresh();
    try {
      await j.append(created('taken'));
      // Someone else got there first with the id the control plane will use for its abort.
      const squat = await j.append({
        type: 'room.abort_requested',
        room: 'taken',
        source: 'engine:rogue',
        eventId: 'taken:aborted',
        data: { reason: 'junk' },
      });
      expect(squat.status).toBe('applied');
      const head = await j.headSeq();
      const attempts = [
        // Same type and room, another source.
        { type: 'room.abort_requested', source: 'control', data: { reason: 'operator' } },
        // Another type.
        { type: 'room.aborted', source: 'engine:rogue', data: { reason: 'x', source: 'api' } },
      ];
      for (const a of attempts) {
        const res = await j.append({ ...a, room: 'taken', eventId: 'taken:aborted' } as never);
        expect(res).toMatchObject({
          status: 'rejected',
          reason: 'event_id_conflict',
          seq: squat.seq,
          detail: expect.stringContaining('is not that event'),
        });
      }
      // Under an id taken by a rejection record: compared with the event it refused.
      const late = await j.append({
        type: 'room.bootstrap_started',
        room: 'nowhere',
        source: 'engine:d0',
        eventId: 'late-1',
        data: {},
      });
      expect(late.status).toBe('rejected');
      expect(
        await j.append({
          type: 'room.bootstrap_started',
          room: 'nowhere',
          source: 'engine:d0',
          eventId: 'late-1',
          data: {},
        }),
      ).toMatchObject({ status: 'duplicate', original: 'rejected' });
      expect(
        await j.append({
          type: 'room.decode_started',
          room: 'nowhere',
          source: 'engine:d0',
          eventId: 'late-1',
          data: {},
        }),
      ).toMatchObject({ status: 'rejected', reason: 'event_id_conflict' });
      // Only the rejection record of `late-1` was written (a refused insert may still use up a seq).
      expect((await j.tail({ afterSeq: head, order: 'oldest' })).map((e) => e.eventId)).toEqual([
        'late-1',
      ]);
      expect((await j.verify()).ok).toBe(true);
    } finally {
      await j.drain();
    }
  });

  it('refuses invalid events with a coded error that names the field, and writes nothing', async () => {
    const j = await fresh();
    try {
      const bad = [
        { type: 'room.nope', room: 'x', source: 't', data: {} },
        { type: 'room.created', source: 't', data: { prefillEngine: 'p0', decodeEngine: 'd0' } },
        { type: 'room.created', room: 'x', source: 't', data: { prefillEngine: 'p0' } },
        {
          type: 'room.transfer_completed',
          room: 'x',
          source: 't',
          data: { bytes: -1, checksum: 'ab', micros: 1 },
        },
        {
          type: 'room.created',
          room: 'x',
          source: 't',
          data: { prefillEngine: 'p0', decodeEngine: 'd0', extra: 1 },
        },
        { type: 'room.event_rejected', room: 'x', source: 't', data: {} },
        { type: 'room.released', room: 'x', source: 't', data: {} },
        {
          type: 'room.created',
          room: 'x y',
          source: 't',
          data: { prefillEngine: 'p0', decodeEngine: 'd0' },
        },
        'not an object',
      ];
      for (const input of bad) {
        const err = await j.append(input as never).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(JournalError);
        expect((err as JournalError).code).toBe('JOURNAL_INVALID_EVENT');
      }
      const messages = await Promise.all(
        bad.slice(2, 4).map((b) => j.append(b as never).catch((e: Error) => e.message)),
      );
      expect(messages[0]).toMatch(/decodeEngine/);
      expect(messages[1]).toMatch(/data\.bytes/);
      expect(await j.headSeq()).toBe(0);
    } finally {
      await j.drain();
    }
  });

  it('stores room.created with its full deadline table, so replay never depends on this build', async () => {
    const j = await fresh();
    try {
      await j.append({
        type: 'room.created',
        room: 'dl',
        source: 't',
        data: { prefillEngine: 'p0', decodeEngine: 'd0', deadlinesMs: { decoding: 5 } },
      });
      const [ev] = await j.readFrom(0, 1);
      expect(ev?.data.deadlinesMs).toMatchObject({ created: 2000, decoding: 5 });
    } finally {
      await j.drain();
    }
  });
});

describe('SqliteJournal writer supervision', () => {
  it('restarts a crashed writer thread; appends queued meanwhile commit, in-flight ones fail retryably', async () => {
    const j = await fresh({ durability: 'power' });
    try {
      await j.append(created('before-crash'));
      j.crashWriterForDrill();
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

describe('SqliteJournal drain', () => {
  it('never hangs: appends the writer cannot finish in time are rejected and the journal closes', async () => {
    const j = await fresh({ durability: 'power' });
    await j.append(created('drain-before'));
    j.crashWriterForDrill();
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
        await j.limitPagesForDrill(pages);
        let failure: unknown = null;
        let round = 0;
        // Big payloads until a commit needs a page it cannot have.
        while (!failure && round < 200) {
          failure = await Promise.all(
            rooms.map((r) =>
              j.append({
                type: 'room.abort_requested',
                room: r,
                source: 'test',
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
        await j.limitPagesForDrill(null);
        // The writer's room cache must match the database: the failed batch changed nothing. An
        // abort request now must keep the first committed one's reason, as the fold does.
        await Promise.all(
          rooms.map((r) =>
            j.append({
              type: 'room.abort_requested',
              room: r,
              source: 'test',
              data: { reason: 'after' },
            }),
          ),
        );
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

describe('SqliteJournal subscriptions and cursors', () => {
  it('delivers catch-up then live events in seq order with no gap and no duplicate', async () => {
    const j = await fresh();
    try {
      for (let i = 0; i < 1500; i++) void j.append(created(`pre-${i}`));
      await j.append(created('pre-last'));
      const got: JournalEvent[] = [];
      const sub = j.subscribe(0, (e) => got.push(e));
      // Keep appending while the subscriber catches up.
      for (let round = 0; round < 20; round++) {
        await Promise.all(
          Array.from({ length: 50 }, (_, i) => j.append(created(`live-${round}-${i}`))),
        );
      }
      const head = await j.headSeq();
      await new Promise((r) => setTimeout(r, 50));
      sub.close();
      expect(got.map((e) => e.seq)).toEqual(Array.from({ length: head }, (_, i) => i + 1));
      expect(got.at(-1)?.room).toBe('live-19-49');
    } finally {
      await j.drain();
    }
  });

  it('starts from a given seq and keeps delivering when a listener throws', async () => {
    const j = await fresh();
    try {
      for (let i = 0; i < 10; i++) await j.append(created(`s-${i}`));
      const seqs: number[] = [];
      const sub = j.subscribe(7, (e) => {
        seqs.push(e.seq);
        if (e.seq === 9) throw new Error('listener bug');
      });
      await new Promise((r) => setTimeout(r, 20));
      await j.append(created('s-10'));
      await new Promise((r) => setTimeout(r, 20));
      sub.close();
      expect(seqs).toEqual([8, 9, 10, 11]);
    } finally {
      await j.drain();
    }
  });

  it('keeps consumer cursors across a restart', async () => {
    const path = `${dir}/cursor.db`;
    let j = await SqliteJournal.open({ path });
    expect(await j.getCursor('watchdog')).toBeNull();
    await j.setCursor('watchdog', 42);
    await j.drain();
    j = await SqliteJournal.open({ path });
    try {
      expect(await j.getCursor('watchdog')).toBe(42);
      await expect(j.setCursor('', 1)).rejects.toMatchObject({ code: 'JOURNAL_BAD_QUERY' });
    } finally {
      await j.drain();
    }
  });
});

describe('SqliteJournal retention', () => {
  it('deletes whole terminal rooms older than the cut-off in chunks, never a live room, and stays consistent', async () => {
    const j = await fresh();
    try {
      const old = 1_000_000;
      for (let i = 0; i < 25; i++) {
        await j.append(created(`old-${i}`, old));
        await j.append({
          type: 'room.failed',
          room: `old-${i}`,
          source: 'watchdog',
          ts: old + 10,
          data: { reason: 'deadline_exceeded', stage: 'created', detectedBy: 'watchdog' },
        });
      }
      await j.append(created('old-but-live', old));
      await j.append(created('recent'));
      await j.append({
        type: 'room.aborted',
        room: 'recent',
        source: 't',
        data: { reason: 'client_disconnect', source: 'client' },
      });
      const r = await j.prune({ cutoffTs: old + 1000, chunkRooms: 10 });
      expect(r).toMatchObject({ rooms: 25, events: 50, batches: 3 });
      const left = (await j.rooms({ limit: 100 })).rooms.map((x) => x.room).sort();
      expect(left).toEqual(['old-but-live', 'recent']);
      expect((await j.tail({ type: 'journal.pruned', limit: 1 }))[0]?.data).toMatchObject({
        rooms: 25,
        events: 50,
      });
      expect((await j.verify()).ok).toBe(true);
      // A late event for a pruned room is recorded, not applied.
      const late = await j.append({
        type: 'room.released',
        room: 'old-3',
        engine: 'd0',
        source: 'd0',
        data: {},
      });
      expect(late).toMatchObject({ status: 'rejected', reason: 'unknown_room' });
    } finally {
      await j.drain();
    }
  });
});

describe('SqliteJournal queries', () => {
  it('answers rooms in flight at T, filters, pages and per-minute counts', async () => {
    const j = await fresh();
    try {
      const t0 = 1_700_000_000_000;
      const fail = (room: string, ts: number, reason: string) =>
        j.append({
          type: 'room.failed',
          room,
          source: 'watchdog',
          ts,
          data: { reason, stage: 'created', detectedBy: 'watchdog' },
        });
      await j.append(created('a', t0));
      await j.append(created('b', t0 + 1000));
      await fail('a', t0 + 61_000, 'deadline_exceeded');
      await j.append(created('c', t0 + 62_000));
      await fail('b', t0 + 63_000, 'kv_pool_exhausted');
      const at = async (t: number) =>
        (await j.rooms({ inFlightAt: t })).rooms.map((r) => r.room).sort();
      expect(await at(t0 + 500)).toEqual(['a']);
      expect(await at(t0 + 61_500)).toEqual(['b']);
      expect(await at(t0 + 64_000)).toEqual(['c']);
      expect(
        (await j.rooms({ state: 'failed', reason: 'kv_pool_exhausted' })).rooms.map((r) => r.room),
      ).toEqual(['b']);
      expect(
        (await j.rooms({ engine: 'd0', since: t0 + 62_500 })).rooms.map((r) => r.room).sort(),
      ).toEqual(['b', 'c']);
      // Origin: the source of room.created; a canary room is left out only when asked.
      // (After the per-minute window below, so that its counts stay as they are.)
      await j.append({ ...created('k', t0 + 200_000), source: 'canary' });
      const ids = async (f: Parameters<typeof j.rooms>[0]) =>
        (await j.rooms(f)).rooms.map((r) => r.room).sort();
      expect(await ids({ since: t0 + 63_500 })).toEqual(['c', 'k']);
      expect(await ids({ since: t0 + 63_500, ...originFilter(undefined) })).toEqual(['c']);
      expect(await ids({ ...originFilter('canary') })).toEqual(['k']);
      expect(await ids({ ...originFilter('test,canary') })).toEqual(['a', 'b', 'c', 'k']);
      expect(await ids({ ...originFilter('all') })).toEqual(['a', 'b', 'c', 'k']);
      expect(() => originFilter('a b')).toThrow(/comma-separated list of room origins/);
      const page1 = await j.rooms({ limit: 2, excludeOrigin: ['canary'] });
      const page2 = await j.rooms({
        limit: 2,
        excludeOrigin: ['canary'],
        cursor: page1.nextCursor as string,
      });
      expect([...page1.rooms, ...page2.rooms].map((r) => r.room)).toEqual(['c', 'b', 'a']);
      expect(page2.nextCursor).toBeNull();
      await expect(j.rooms({ cursor: 'garbage' })).rejects.toMatchObject({
        code: 'JOURNAL_BAD_QUERY',
      });
      const minutes = await j.perMinute({ since: t0, until: t0 + 120_000 });
      expect(minutes).toEqual([
        { minute: t0 - (t0 % 60_000), state: 'created', reason: null, count: 2 },
        { minute: t0 - (t0 % 60_000) + 60_000, state: 'created', reason: null, count: 1 },
        {
          minute: t0 - (t0 % 60_000) + 60_000,
          state: 'failed',
          reason: 'deadline_exceeded',
          count: 1,
        },
        {
          minute: t0 - (t0 % 60_000) + 60_000,
          state: 'failed',
          reason: 'kv_pool_exhausted',
          count: 1,
        },
      ]);
      const tail = await j.tail({ room: 'b', limit: 10 });
      expect(tail.map((e) => e.type)).toEqual(['room.created', 'room.failed']);
    } finally {
      await j.drain();
    }
  });

  it('allows one writer per journal file', async () => {
    const path = `${dir}/one-writer.db`;
    const j = await SqliteJournal.open({ path });
    await expect(SqliteJournal.open({ path })).rejects.toMatchObject({ code: 'JOURNAL_BUSY' });
    await j.drain();
    const again = await SqliteJournal.open({ path });
    await again.drain();
  });

  it('refuses appends after drain with JOURNAL_CLOSED', async () => {
    const j = await fresh();
    await j.drain();
    await expect(j.append(created('z'))).rejects.toMatchObject({ code: 'JOURNAL_CLOSED' });
    await j.drain();
  });
});
