/**
 * What a starting control plane finds of its predecessor's rooms (orphans.ts): the rooms in flight
 * it fails, the ended ones still awaiting a release it takes releases for — and a journal that
 * refuses writes does not stop it from starting.
 */
import { describe, expect, it } from 'vitest';
import { created, lifecycle } from '../../../test/helpers/events.ts';
import { MemoryDisk } from '../../journal/memory/disk.ts';
import { silentLogger } from '../../log.ts';
import { MemoryJournal } from '../../sim/world/journal.ts';
import { failOrphans, roomsAwaitingRelease, roomsInFlight } from './orphans.ts';

const T0 = 1_700_000_000_000;

function journal(): MemoryJournal {
  return MemoryJournal.open({ disk: new MemoryDisk('orphans') });
}

/** A room's whole life at `ts`, less its last `drop` events (the releases come last). */
async function lived(j: MemoryJournal, room: string, ts: number, drop = 0): Promise<void> {
  const events = lifecycle(room);
  for (const ev of events.slice(0, events.length - drop)) await j.append({ ...ev, ts });
}

describe('a starting control plane', () => {
  it('finds the rooms that ended shortly before the journal’s end and that an engine has not released', async () => {
    const j = journal();
    await lived(j, 'long-ago', T0, 1);
    await lived(j, 'released', T0 + 600_000);
    await lived(j, 'one-release-missing', T0 + 600_000, 1);
    await j.append(created('in-flight', T0 + 601_000));
    expect((await roomsAwaitingRelease(j)).map((r) => r.room)).toEqual(['one-release-missing']);
    expect((await roomsInFlight(j)).map((r) => r.room)).toEqual(['in-flight']);
    await j.drain();
  });

  it('starts on a journal that refuses writes: the orphans it cannot fail are returned, to fail once it takes writes', async () => {
    const j = journal();
    await j.append(created('in-flight', T0));
    const orphans = await roomsInFlight(j);
    j.refuseWrites('the disk is full');
    await expect(failOrphans(j, orphans, silentLogger)).resolves.toEqual(['in-flight']);
    j.refuseWrites(null);
    expect((await roomsInFlight(j)).map((r) => r.room)).toEqual(['in-flight']);
    await j.drain();
  });
});
