/** Retention while serving, on the in-memory journal and a virtual clock. */
import { describe, expect, it } from 'vitest';
import { created } from '../../test/helpers/events.ts';
import { tempDir } from '../../test/helpers/tmp.ts';
import { silentLogger } from '../log.ts';
import { VirtualClock } from '../sim/world/clock.ts';
import { MemoryJournal } from '../sim/world/journal.ts';
import { openArchiveReader } from './archive/segments.ts';
import { MemoryDisk } from './memory/disk.ts';
import { Retention, retentionPolicy } from './retention.ts';

/** Lets the journal's turns and the retention's awaits run, the clock standing still. */
async function settle(clock: VirtualClock): Promise<void> {
  for (let i = 0; i < 200; i++) {
    clock.advance(0);
    await new Promise((r) => setImmediate(r));
  }
}

function setUp() {
  const clock = new VirtualClock();
  const journal = MemoryJournal.open({ disk: new MemoryDisk('retention'), clock });
  const ended = async (room: string) => {
    await journal.append(created(room));
    await journal.append({
      type: 'room.aborted',
      room,
      source: 'api',
      data: { reason: 'client_disconnect', source: 'client' },
    });
    // Released by both its engines: only then may retention take it.
    for (const engine of ['p0', 'd0'])
      await journal.append({
        type: 'room.released',
        room,
        engine,
        source: engine,
        data: { pages: 0 },
      });
  };
  return { clock, journal, ended };
}

describe('journal retention while serving', () => {
  it('prunes on its schedule: rooms past the horizon go, live and recent ones stay', async () => {
    const { clock, journal, ended } = setUp();
    const done = Promise.all([ended('old'), journal.append(created('live'))]);
    await settle(clock);
    await done;
    const retention = new Retention(
      journal,
      { roomsMs: 60_000, everyMs: 10_000 },
      silentLogger,
      clock,
    );
    retention.start();
    await settle(clock);
    expect(retention.status().last?.result.rooms, 'the first pass, at once: nothing old').toBe(0);
    for (let s = 0; s < 3; s++) {
      clock.advance(10_000);
      await settle(clock);
    }
    const recent = ended('recent');
    await settle(clock);
    await recent;
    for (let s = 0; s < 4; s++) {
      clock.advance(10_000);
      await settle(clock);
    }
    const status = retention.status();
    expect(status.totals).toMatchObject({ rooms: 1, events: 4, otherEvents: 0 });
    expect(status.lastByOperator, 'only scheduled passes ran').toBeNull();
    expect(status.totals.passes).toBeGreaterThanOrEqual(6);
    expect(status.policy).toMatchObject({ roomsMs: 60_000, eventsMs: 60_000, everyMs: 10_000 });
    const left = (await journal.rooms({ limit: 10 })).rooms.map((r) => r.room).sort();
    expect(left).toEqual(['live', 'recent']);
    const pruned = await journal.tail({ type: 'journal.pruned' });
    expect(pruned.map((e) => e.data.rooms)).toEqual([1]);
    await retention.stop();
    expect((await journal.verify()).ok).toBe(true);
  });

  it('runs one pass at a time, and stop() ends the one in flight between chunks', async () => {
    const { clock, journal, ended } = setUp();
    const all = Promise.all(Array.from({ length: 20 }, (_, i) => ended(`r${i}`)));
    await settle(clock);
    await all;
    clock.advance(1000);
    const retention = new Retention(journal, null, silentLogger, clock);
    const pass = retention.runNow({ roomsMs: 500, chunkRooms: 1 });
    expect(pass).toMatchObject({ by: 'operator', ms: null });
    expect(retention.runNow({ roomsMs: 500 }), 'a second pass while one runs').toBeNull();
    expect(retention.status().running).not.toBeNull();
    clock.advance(0);
    await new Promise((r) => setImmediate(r));
    const stopped = retention.stop();
    await settle(clock);
    await stopped;
    const { last, running, lastByOperator } = retention.status();
    expect(running).toBeNull();
    expect(lastByOperator).toBe(last);
    expect(last?.result.rooms).toBeGreaterThan(0);
    expect(last?.result.rooms).toBeLessThan(20);
    expect(retention.runNow({ roomsMs: 500 }), 'stopped: no more passes').toBeNull();
    expect((await journal.verify()).ok).toBe(true);
  });

  it("archives what it prunes first, an operator's pass where its own passes do", async () => {
    const { clock, journal, ended } = setUp();
    const all = Promise.all([ended('a'), ended('b')]);
    await settle(clock);
    await all;
    clock.advance(1000);
    const dir = tempDir('pdctl-retention-archive-');
    // Its schedule (not started) archives to `dir`: so does a pass the operator asks for
    // (journal prune --url), which names no directory of its own.
    const retention = new Retention(
      journal,
      { roomsMs: 86_400_000, archiveDir: dir },
      silentLogger,
      clock,
    );
    retention.runNow({ roomsMs: 500 });
    await settle(clock);
    expect(retention.status().last?.result.rooms).toBe(2);
    const archived = openArchiveReader(dir);
    expect((await archived.rooms({ limit: 10 })).rooms.map((r) => r.room).sort()).toEqual([
      'a',
      'b',
    ]);
    expect((await journal.rooms({ limit: 10 })).rooms).toEqual([]);
  });

  it('fills in its defaults and refuses an events horizon shorter than the rooms one', () => {
    expect(retentionPolicy({ roomsMs: 300_000 })).toEqual({
      roomsMs: 300_000,
      eventsMs: 300_000,
      everyMs: 30_000,
      chunkRooms: 25,
      duty: 0.5,
      archiveDir: null,
    });
    expect(retentionPolicy({ roomsMs: 7 * 86_400_000 }).everyMs).toBe(600_000);
    expect(retentionPolicy({ roomsMs: 60_000, eventsMs: null }).eventsMs).toBeNull();
    expect(() => retentionPolicy({ roomsMs: 60_000, eventsMs: 1000 })).toThrow(
      'at least as long as rooms',
    );
    expect(() => retentionPolicy({ roomsMs: 60_000, duty: 0 })).toThrow('duty');
  });
});
