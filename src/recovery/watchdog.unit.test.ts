/**
 * The watchdog given a journal and a clock it does not own — the in-memory journal and a virtual
 * clock (issue 41): no SQLite, no sockets, no real timers. Given rooms, when time passes, then
 * what it journaled.
 */
import { describe, expect, it } from 'vitest';
import { created } from '../../test/helpers/events.ts';
import { MemoryDisk } from '../journal/memory/disk.ts';
import { silentLogger } from '../log.ts';
import type { JournalEvent } from '../room/events.ts';
import { type Room, reduce } from '../room/reducer.ts';
import { DEFAULT_STATE_DEADLINES_MS, isTerminal } from '../room/states.ts';
import { VirtualClock } from '../sim/world/clock.ts';
import { MemoryJournal } from '../sim/world/journal.ts';
import { decideOverdue, Watchdog } from './watchdog.ts';

const T0 = Date.UTC(2026, 11, 3);

function given(...rooms: string[]) {
  const clock = new VirtualClock(T0);
  const disk = new MemoryDisk('watchdog');
  const journal = MemoryJournal.open({ disk, clock });
  const unrecorded: string[] = [];
  const watchdog = new Watchdog(
    {
      liveRooms: () => [...disk.rooms.values()].filter((r) => !isTerminal(r.state)).values(),
      // As the control plane's: the client's stream is ended once; after that there is none.
      endUnrecorded: (room) => {
        if (unrecorded.includes(room)) return false;
        unrecorded.push(room);
        return true;
      },
    },
    journal,
    silentLogger,
    100,
    clock,
  );
  const appended = Promise.all(rooms.map((r) => journal.append(created(r, T0))));
  // The journal commits on the clock: it runs for the appends to be taken.
  const ready = clock.run(0).then(() => appended);
  return { clock, disk, journal, watchdog, unrecorded, ready };
}

describe('the watchdog, on a virtual clock and the in-memory journal', () => {
  it('fails a room that overstays its state once, when the clock passes its deadline, and journals why', async () => {
    const { clock, disk, journal, watchdog, ready } = given('r-late');
    await ready;
    const deadline = disk.rooms.get('r-late')?.deadlineAt as number;
    expect(deadline).toBeGreaterThan(T0);
    watchdog.start();
    await clock.run(deadline - T0 - 1);
    expect(disk.rooms.get('r-late')?.state).toBe('created');
    await clock.run(100);
    await clock.run(1000);
    expect(disk.rooms.get('r-late')).toMatchObject({
      state: 'failed',
      reason: 'deadline_exceeded',
    });
    const failed = await journal.tail({ type: 'room.failed', room: 'r-late' });
    expect(failed.map((e) => e.data)).toEqual([
      { reason: 'deadline_exceeded', stage: 'created', detectedBy: 'watchdog' },
    ]);
    const actions = await journal.tail({ type: 'recovery.action', room: 'r-late' });
    expect(actions.map((e) => e.data)).toEqual([
      expect.objectContaining({ action: 'fail_overdue_room', outcome: 'room failed' }),
    ]);
    const detectMs = actions.map((e) => (e.data as { detectMs?: number }).detectMs);
    expect(detectMs[0]).toBeLessThanOrEqual(100);
    expect(watchdog.stats.failed).toBe(1);
    watchdog.stop();
    await journal.drain();
  });

  it('while the journal refuses writes, answers the client at once and fails the room when it can', async () => {
    const { clock, disk, journal, watchdog, unrecorded, ready } = given('r-outage');
    await ready;
    const deadline = disk.rooms.get('r-outage')?.deadlineAt as number;
    journal.refuseWrites('the simulated disk is full');
    watchdog.start();
    await clock.run(deadline - T0 + 100);
    expect(unrecorded).toEqual(['r-outage']);
    expect(disk.rooms.get('r-outage')?.state).toBe('created');
    journal.refuseWrites(null);
    await clock.run(100);
    expect(disk.rooms.get('r-outage')?.state).toBe('failed');
    expect(watchdog.stats.endedUnrecorded).toBe(1);
    watchdog.stop();
    await journal.drain();
  });
});

/** A room as the journal folds its `room.created` at `ts`. */
function createdAt(id: string, ts: number): Room {
  const ev = {
    seq: 1,
    ts,
    type: 'room.created',
    room: id,
    engine: null,
    source: 'test',
    eventId: id,
    data: { prefillEngine: 'p0', decodeEngine: 'd0', deadlinesMs: DEFAULT_STATE_DEADLINES_MS },
  } as JournalEvent;
  const folded = reduce(null, ev);
  if (!folded.ok) throw new Error(folded.detail);
  return folded.room;
}

describe('decideOverdue: given rooms and a time, which to fail (no journal, no clock)', () => {
  const allowed = DEFAULT_STATE_DEADLINES_MS.created;

  it('given rooms within their deadline, fails none; past it, each with how late and its deadline', () => {
    const rooms = [createdAt('early', T0), createdAt('late', T0 - allowed - 40)];
    expect(decideOverdue(rooms, T0 + 10, new Set())).toEqual([
      { room: rooms[1], lateMs: 50, allowedMs: allowed },
    ]);
    expect(decideOverdue(rooms, T0 + allowed, new Set()).map((o) => o.room.room)).toEqual([
      'early',
      'late',
    ]);
  });

  it('when a room’s failure is already on its way to the journal, does not fail it again', () => {
    const rooms = [createdAt('late', T0 - allowed - 1)];
    expect(decideOverdue(rooms, T0, new Set(['late']))).toEqual([]);
  });
});
