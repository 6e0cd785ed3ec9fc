/**
 * The journal's contract, run against every backend (src/journal/sqlite/journal.int.test.ts,
 * src/journal/postgres/journal.int.test.ts, src/journal/memory/journal.unit.test.ts): append,
 * group commit, rejection records, idempotent event ids, validation, subscriptions, cursors,
 * retention and queries behave the same on SQLite, PostgreSQL and in memory. What only one backend has (a writer thread, a full disk, leadership)
 * is tested beside it.
 */
import { describe, expect, it } from 'vitest';
import { archiveChunk, openArchiveReader } from '../../src/journal/archive/segments.ts';
import { JournalError } from '../../src/journal/errors.ts';
import { type Durability, type JournalStore, originFilter } from '../../src/journal/store.ts';
import type { EventInput, JournalEvent } from '../../src/room/events.ts';
import type { RoomFailureReason } from '../../src/room/reasons.ts';
import { LIVE_STATES } from '../../src/room/states.ts';
import { created, lifecycle } from './events.ts';
import { tempDir } from './tmp.ts';

export interface ContractBackend {
  name: string;
  /** A new, empty journal. */
  fresh(opts?: { durability?: Durability }): Promise<JournalStore>;
  /** Where a new journal will live (a file path, a database URL), for opening it more than once. */
  place(): Promise<string>;
  /** Opens (creating) the journal at `place` for writing. */
  open(place: string): Promise<JournalStore>;
  /** Events with seq ≤ `seq`, counted on a connection of the test's own. */
  countCommitted(j: JournalStore, seq: number): Promise<number>;
}

export function journalContract(b: ContractBackend): void {
  const fresh = b.fresh;
  describe(`${b.name} journal: append`, () => {
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
        const seen = await b.countCommitted(j, Math.max(...results.map((r) => r.seq)));
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
      const place = await b.place();
      let j = await b.open(place);
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
      j = await b.open(place);
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

    it('keeps ids of every stored form exactly, each once, across a restart', async () => {
      const place = await b.place();
      let j = await b.open(place);
      const uuid = (n: number) => `01a23fd8-2e22-7000-9901-83b1267ddc8${n}`;
      const events = [
        { ...created('forms'), eventId: uuid(1) },
        {
          type: 'room.bootstrap_started',
          room: 'forms',
          engine: 'd0',
          source: 'engine:d0',
          eventId: `engine:d0/${uuid(2)}`,
          data: {},
        },
        {
          type: 'room.abort_requested',
          room: 'forms',
          source: 'operator',
          eventId: 'forms:abort-é',
          data: { reason: 'x' },
        },
        // An engine's namespace on another source: text, not that engine's key.
        { ...created('forms-2'), source: 'api', eventId: `engine:d0/${uuid(3)}` },
      ] as EventInput[];
      const seqs: number[] = [];
      for (const ev of events) seqs.push((await j.append(ev)).seq);
      await j.drain();
      j = await b.open(place);
      try {
        const read = await j.tail({ afterSeq: (seqs[0] as number) - 1, order: 'oldest' });
        expect(read.map((e) => e.eventId)).toEqual(events.map((e) => e.eventId));
        for (const [i, ev] of events.entries())
          expect(await j.append(ev)).toMatchObject({ status: 'duplicate', seq: seqs[i] });
        // The key of an engine's id leaves its namespace out: the same UUID in another engine's
        // namespace is that id taken, refused as a different event (docs/journal.md).
        expect(
          await j.append({
            type: 'room.prefill_started',
            room: 'forms',
            engine: 'p0',
            source: 'engine:p0',
            eventId: `engine:p0/${uuid(2)}`,
            data: {},
          } as EventInput),
        ).toMatchObject({ status: 'rejected', reason: 'event_id_conflict', seq: seqs[1] });
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
        if (ev?.type !== 'room.created') throw new Error(`read ${ev?.type}, not room.created`);
        expect(ev.data.deadlinesMs).toMatchObject({ created: 2000, decoding: 5 });
      } finally {
        await j.drain();
      }
    });
  });

  describe(`${b.name} journal: subscriptions and cursors`, () => {
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
      const place = await b.place();
      let j = await b.open(place);
      expect(await j.getCursor('watchdog')).toBeNull();
      await j.setCursor('watchdog', 42);
      await j.drain();
      j = await b.open(place);
      try {
        expect(await j.getCursor('watchdog')).toBe(42);
        await expect(j.setCursor('', 1)).rejects.toMatchObject({ code: 'JOURNAL_BAD_QUERY' });
      } finally {
        await j.drain();
      }
    });

    it('keeps the latest state checkpoint of each name across a restart, stamped with its schema', async () => {
      const place = await b.place();
      let j = await b.open(place);
      expect(await j.getCheckpoint('control')).toBeNull();
      const row = (seq: number, data: string) => ({
        name: 'control',
        seq,
        format: 1,
        digest: `digest-${seq}`,
        data,
      });
      await j.setCheckpoint(row(7, '{"a":1}'));
      await j.setCheckpoint(row(9, '{"a":2}'));
      await j.setCheckpoint({ ...row(3, '{}'), name: 'other' });
      await j.drain();
      j = await b.open(place);
      try {
        const stored = await j.getCheckpoint('control');
        expect(stored).toMatchObject(row(9, '{"a":2}'));
        const { schemaVersion } = await j.stats();
        expect(stored?.schemaVersion).toBe(schemaVersion);
        expect(stored?.currentSchemaVersion).toBe(schemaVersion);
        expect(stored?.writtenAt).toBeGreaterThan(0);
        expect((await j.getCheckpoint('other'))?.seq).toBe(3);
      } finally {
        await j.drain();
      }
    });
  });

  describe(`${b.name} journal: retention`, () => {
    /** Its engine's `room.released` (p0's or d0's), at `ts` when given. */
    const released = (room: string, engine: 'p0' | 'd0', ts?: number): EventInput => ({
      type: 'room.released',
      room,
      engine,
      source: engine,
      ...(ts !== undefined ? { ts } : {}),
      data: { pages: 0 },
    });

    /** Rooms `old-0` … created at `ts`, aborted a millisecond later and released by both engines. */
    const endedRooms = async (j: JournalStore, n: number, ts: number) => {
      for (let i = 0; i < n; i++) {
        await j.append(created(`old-${i}`, ts));
        await j.append({
          type: 'room.aborted',
          room: `old-${i}`,
          source: 't',
          ts: ts + 1,
          data: { reason: 'client_disconnect', source: 'client' },
        });
        await j.append(released(`old-${i}`, 'p0', ts + 2));
        await j.append(released(`old-${i}`, 'd0', ts + 2));
      }
    };

    it('deletes whole terminal rooms older than the cut-off in chunks, never a live room or one awaiting a release, and stays consistent', async () => {
      const j = await fresh();
      try {
        const old = 1_000_000;
        for (const i of Array.from({ length: 26 }, (_, n) => n)) {
          const room = i < 25 ? `old-${i}` : 'old-awaiting-d0';
          await j.append(created(room, old));
          await j.append({
            type: 'room.failed',
            room,
            source: 'watchdog',
            ts: old + 10,
            data: { reason: 'deadline_exceeded', stage: 'created', detectedBy: 'watchdog' },
          });
          await j.append(released(room, 'p0', old + 20));
          if (i < 25) await j.append(released(room, 'd0', old + 20));
        }
        await j.append(created('old-but-live', old));
        await j.append(created('recent'));
        await j.append({
          type: 'room.aborted',
          room: 'recent',
          source: 't',
          data: { reason: 'client_disconnect', source: 'client' },
        });
        expect(await j.countPrunable(old + 1000)).toMatchObject({ rooms: 25, events: 100 });
        const r = await j.prune({ cutoffTs: old + 1000, chunkRooms: 10 });
        expect(r).toMatchObject({ rooms: 25, events: 100, batches: 3 });
        // d0 has yet to release one: an engine that reconnects is replayed it from here.
        const left = (await j.rooms({ limit: 100 })).rooms.map((x) => x.room).sort();
        expect(left).toEqual(['old-awaiting-d0', 'old-but-live', 'recent']);
        expect((await j.tail({ type: 'journal.pruned', limit: 1 }))[0]?.data).toMatchObject({
          rooms: 25,
          events: 100,
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

    it('past the events horizon deletes events of no room and rejection records of none, keeps what a restart rebuilds from, and counts it first', async () => {
      const j = await fresh();
      try {
        const old = 1_000_000;
        const engineEvent = (type: EventInput['type'], data: object, ts = old): EventInput =>
          ({ type, engine: 'd0', source: 'control', ts, data }) as EventInput;
        await j.append(engineEvent('engine.registered', { role: 'decode', incarnation: 'i-1' }));
        await j.append(engineEvent('engine.stalled', { reason: 'no heartbeat for 3 s' }));
        await j.append(engineEvent('engine.cordoned', { reason: 'x', by: 'operator' }));
        // A tenant and its key: a restart's API needs them, however old they are.
        const hash = 'ab'.repeat(32);
        await j.append({
          type: 'tenant.added',
          source: 'operator',
          ts: old,
          data: { tenant: 'acme', band: 'interactive', keyHash: hash, keyId: hash.slice(0, 8) },
        });
        await j.append(engineEvent('engine.stalled', { reason: 'still silent' }, old + 5000));
        // A rejection record of a room that never existed: it has a room, but no row.
        const stray = await j.append({
          type: 'room.released',
          room: 'never-was',
          engine: 'd0',
          source: 'd0',
          ts: old,
          data: {},
        });
        expect(stray).toMatchObject({ status: 'rejected', reason: 'unknown_room' });
        await j.append(created('old-but-live', old));
        const eventsCutoffTs = old + 1000;
        expect(await j.countPrunable(old + 1000, eventsCutoffTs)).toEqual({
          rooms: 0,
          events: 0,
          otherEvents: 2,
        });
        await expect(
          j.prune({ cutoffTs: old, eventsCutoffTs: old + 1 }),
          'an events horizon shorter than the rooms one',
        ).rejects.toMatchObject({ code: 'JOURNAL_BAD_QUERY' });
        const r = await j.prune({ cutoffTs: old + 1000, eventsCutoffTs, chunkRooms: 1 });
        expect(r).toMatchObject({ rooms: 0, otherEvents: 2, eventsCutoffTs, batches: 1 });
        const left = (await j.readFrom(0, 100)).map((e) => `${e.type} ${e.room ?? ''}`.trim());
        expect(left).toEqual([
          'engine.registered',
          'engine.cordoned',
          'tenant.added',
          'engine.stalled',
          'room.created old-but-live',
          'journal.pruned',
        ]);
        const pruned = (await j.tail({ type: 'journal.pruned', limit: 1 }))[0];
        expect(pruned?.data).toMatchObject({ rooms: 0, otherEvents: 2, eventsCutoffTs });
        expect((await j.verify()).ok).toBe(true);
      } finally {
        await j.drain();
      }
    });

    it('archives each chunk before it deletes it, the archive reads as a journal, and a late event waits for the next chunk', async () => {
      const j = await fresh();
      const dir = tempDir('pdctl-archive-');
      try {
        const old = 1_000_000;
        await endedRooms(j, 5, old);
        await j.append({
          type: 'engine.stalled',
          engine: 'd0',
          source: 'control',
          ts: old,
          data: { reason: 'no heartbeat for 3 s' },
        });
        let calls = 0;
        const refused = j.prune({
          cutoffTs: old + 1000,
          chunkRooms: 2,
          archive: (chunk) => {
            if (++calls === 2) return Promise.reject(new Error('archive disk full'));
            archiveChunk(dir, chunk);
            return Promise.resolve();
          },
        });
        await expect(refused, 'an archive that fails stops the prune').rejects.toThrow(
          'archive disk full',
        );
        expect((await j.rooms({ limit: 10 })).rooms, 'nothing deleted unarchived').toHaveLength(3);
        const gap = await j.tail({ type: 'journal.pruned', limit: 1 });
        expect(gap[0]?.data, 'what it deleted first is journaled').toMatchObject({
          rooms: 2,
          archived: true,
        });
        let late: string | null = null;
        const r = await j.prune({
          cutoffTs: old + 1000,
          eventsCutoffTs: old + 1000,
          chunkRooms: 2,
          archive: async (chunk) => {
            archiveChunk(dir, chunk);
            if (late === null && chunk.rooms[0]) {
              // An event arriving after the chunk was read (a release sent twice, recorded as
              // refused): not deleted unarchived.
              late = chunk.rooms[0].room;
              await j.append(released(late, 'p0'));
            }
          },
        });
        expect(r).toMatchObject({ rooms: 3, events: 13, otherEvents: 1, archived: true });
        const pruned = await j.tail({ type: 'journal.pruned', limit: 1 });
        expect(pruned[0]?.data).toMatchObject({ rooms: 3, archived: true });
        expect((await j.rooms({ limit: 10 })).rooms).toHaveLength(0);
        expect((await j.verify()).ok).toBe(true);
        const archived = openArchiveReader(dir);
        const t = await archived.timeline(late ?? 'none');
        expect(t.room).toMatchObject({ state: 'aborted', releasedBy: ['p0', 'd0'] });
        expect(t.events.map((e) => e.type)).toEqual([
          'room.created',
          'room.aborted',
          'room.released',
          'room.released',
          'room.event_rejected',
        ]);
        expect((await archived.rooms({ limit: 10 })).rooms).toHaveLength(5);
        expect((await archived.tail({ type: 'engine.stalled' })).map((e) => e.engine)).toEqual([
          'd0',
        ]);
        expect((await archived.stats()).events).toBe(5 * 4 + 1 + 1);
      } finally {
        await j.drain();
      }
    });

    it('lets appends commit between its chunks', async () => {
      const j = await fresh();
      try {
        const old = 1_000_000;
        await endedRooms(j, 30, old);
        const order: string[] = [];
        const pruning = j
          .prune({ cutoffTs: old + 1000, chunkRooms: 1 })
          .then((r) => order.push(`pruned ${r.rooms}`));
        await j.append(created('during')).then(() => order.push('appended'));
        await pruning;
        expect(order).toEqual(['appended', 'pruned 30']);
      } finally {
        await j.drain();
      }
    });
  });

  describe(`${b.name} journal: queries`, () => {
    it("gives an engine's backlog: a fresh engine its live rooms, a reconnecting one its rooms after a seq, ended ones too", async () => {
      const j = await fresh();
      try {
        await j.append(created('ended'));
        await j.append(created('live'));
        await j.append({
          type: 'room.failed',
          room: 'ended',
          source: 'watchdog',
          data: { reason: 'deadline_exceeded', stage: 'created', detectedBy: 'watchdog' },
        });
        await j.append({
          type: 'room.created',
          room: 'other',
          source: 'test',
          data: { prefillEngine: 'p1', decodeEngine: 'd1' },
        });
        const rooms = async (afterSeq: number, liveOnly?: boolean) => {
          const b = await j.engineBacklog('d0', afterSeq, liveOnly);
          expect(b.headSeq).toBe(4);
          return b.events.map((e) => `${e.seq} ${e.room}`);
        };
        expect(await rooms(0)).toEqual(['2 live']);
        // Found by the simulator (--faults control-freeze): an engine that reconnected having
        // applied nothing was sent nothing of the rooms that ended meanwhile, and never released them.
        expect(await rooms(0, false)).toEqual(['1 ended', '2 live', '3 ended']);
        expect(await rooms(1)).toEqual(['2 live', '3 ended']);
        expect(await rooms(3, true)).toEqual(['2 live']);
      } finally {
        await j.drain();
      }
    });

    it('answers rooms in flight at T, filters, pages and per-minute counts', async () => {
      const j = await fresh();
      try {
        const t0 = 1_700_000_000_000;
        const fail = (room: string, ts: number, reason: RoomFailureReason) =>
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
        await fail('b', t0 + 63_000, 'kv_pool_full');
        const at = async (t: number) =>
          (await j.rooms({ inFlightAt: t })).rooms.map((r) => r.room).sort();
        expect(await at(t0 + 500)).toEqual(['a']);
        expect(await at(t0 + 61_500)).toEqual(['b']);
        expect(await at(t0 + 64_000)).toEqual(['c']);
        expect(
          (await j.rooms({ state: 'failed', reason: 'kv_pool_full' })).rooms.map((r) => r.room),
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
        // Request id: the x-request-id on room.created; a migration's continuation has the same.
        const asked = (room: string, ts: number, extra: Record<string, string>) =>
          j.append({
            type: 'room.created',
            room,
            source: 'test',
            ts,
            data: { prefillEngine: 'p0', decodeEngine: 'd0', ...extra },
          });
        await asked('q1', t0 + 200_001, { requestId: 'incident-7', tenant: 'acme' });
        await j.append({
          type: 'room.migrated',
          room: 'q1',
          source: 'control',
          ts: t0 + 200_002,
          data: { toRoom: 'q2', reason: 'engine_lost' },
        });
        await asked('q2', t0 + 200_003, {
          requestId: 'incident-7',
          migratedFrom: 'q1',
          tenant: 'acme',
        });
        expect(await ids({ requestId: 'incident-7' })).toEqual(['q1', 'q2']);
        // Tenant: the one whose key the request came with, on each of its rooms.
        expect(await ids({ tenant: 'acme' })).toEqual(['q1', 'q2']);
        expect((await j.rooms({ tenant: 'acme' })).rooms[0]?.tenant).toBe('acme');
        expect(await ids({ tenant: 'other' })).toEqual([]);
        expect((await j.timeline('k')).room?.tenant).toBeNull();
        expect((await j.rooms({ requestId: 'incident-7' })).rooms[0]?.requestId).toBe('incident-7');
        expect(await ids({ requestId: 'nobody' })).toEqual([]);
        expect((await j.timeline('k')).room?.requestId).toBeNull();
        const page1 = await j.rooms({ limit: 2, excludeOrigin: ['canary'], until: t0 + 199_999 });
        const page2 = await j.rooms({
          limit: 2,
          excludeOrigin: ['canary'],
          until: t0 + 199_999,
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
            reason: 'kv_pool_full',
            count: 1,
          },
        ]);
        const tail = await j.tail({ room: 'b', limit: 10 });
        expect(tail.map((e) => e.type)).toEqual(['room.created', 'room.failed']);
        // What a start loads besides rooms in flight: ended rooms an engine has not released.
        for (const [room, by] of [
          ['b', 'p0'],
          ['a', 'p0'],
          ['a', 'd0'],
        ] as const)
          await j.append({
            type: 'room.released',
            room,
            engine: by,
            source: by,
            ts: t0 + 300_000,
            data: {},
          });
        const ended = ['failed', 'completed'] as const;
        expect(await ids({ state: [...ended], since: t0, unreleased: true })).toEqual(['b']);
        expect(await ids({ state: [...ended], since: t0 + 63_500, unreleased: true })).toEqual([]);
        expect(await ids({ state: ['created'], excludeOrigin: ['canary'] })).toEqual(['c', 'q2']);
        // The names a filter can match: engines of rooms and of events, reasons rooms ended for.
        await j.append({
          type: 'engine.stalled',
          engine: 'decode-7',
          source: 'control',
          ts: t0 + 300_001,
          data: { reason: 'no heartbeat for 3 s' },
        });
        expect(await j.names()).toEqual({
          engines: ['d0', 'decode-7', 'p0'],
          reasons: ['deadline_exceeded', 'engine_lost', 'kv_pool_full'],
        });
      } finally {
        await j.drain();
      }
    });

    it('finds the refusals of a request by its id, and only those listing it whole', async () => {
      const j = await fresh();
      try {
        const refusal = (reason: string, requestIds: string[]): EventInput => ({
          type: 'request.refused',
          source: 'api',
          data: { reason, status: 503, count: 3, requestIds, message: 'm', firstAt: 1, lastAt: 2 },
        });
        const a = await j.append(refusal('no_engines', ['req-1', 'req-10']));
        await j.append(refusal('overloaded', ['req-100']));
        const c = await j.append(refusal('engines_draining', ['req-2', 'req-1']));
        await j.append(created('req-1')); // a room named like the request: not a refusal
        const found = await j.tail({ type: 'request.refused', requestId: 'req-1' });
        expect(found.map((e) => e.seq)).toEqual([a.seq, c.seq]);
        expect(await j.tail({ requestId: 'req-10', order: 'oldest' })).toMatchObject([
          { seq: a.seq, data: { reason: 'no_engines' } },
        ]);
        expect(await j.tail({ requestId: 'req' })).toEqual([]);
      } finally {
        await j.drain();
      }
    });

    it('allows one writer per journal, and the next once the first has drained', async () => {
      const place = await b.place();
      const j = await b.open(place);
      await expect(b.open(place)).rejects.toMatchObject({ code: 'JOURNAL_BUSY' });
      await j.drain();
      const again = await b.open(place);
      await again.drain();
    });

    it('refuses appends after drain with JOURNAL_CLOSED', async () => {
      const j = await fresh();
      await j.drain();
      await expect(j.append(created('z'))).rejects.toMatchObject({ code: 'JOURNAL_CLOSED' });
      await j.drain();
    });
  });
}
