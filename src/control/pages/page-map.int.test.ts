/**
 * The page map rebuilt from a real journal, as a control plane does at start: the pages of the
 * rooms in flight, in the pools of the decode engines' latest incarnations.
 */
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { SqliteJournal } from '../../journal/sqlite/journal.ts';
import { completedRoomEvents } from '../../journal/synth.ts';
import type { EventInput } from '../../room/events.ts';
import { newRoomId } from '../../room/ids.ts';
import { StartState } from '../checkpoint/state.ts';
import { roomsInFlight } from '../rooms/orphans.ts';
import { PageMap } from './page-map.ts';

const dir = tempDir('pdctl-page-map-');
const journals: SqliteJournal[] = [];
afterEach(async () => {
  for (const j of journals.splice(0)) await j.drain();
});

const registered = (
  engine: string,
  incarnation: string,
  role: 'prefill' | 'decode' = 'decode',
): EventInput => ({
  type: 'engine.registered',
  engine,
  source: 'control',
  data: { role, incarnation },
});

/**
 * A room's events, its decode pages set to `pages`, cut after `upTo` events (10: completed);
 * `reserved`: the pages are the control plane's reservation in `room.created` (protocol 6).
 */
function room(id: string, pages: number[], upTo: number, reserved?: string): EventInput[] {
  const reservation = { decode: { pages, pool: '/d0', epoch: 1, incarnation: reserved ?? '' } };
  return completedRoomEvents(id)
    .slice(0, upTo)
    .map((e) => {
      if (e.type === 'room.bootstrapped') return { ...e, data: { pages } };
      if (e.type === 'room.created' && reserved) return { ...e, data: { ...e.data, reservation } };
      return e;
    });
}

async function journalOf(events: EventInput[]) {
  const journal = await SqliteJournal.open({
    path: join(dir, `${newRoomId()}.db`),
    durability: 'process',
  });
  journals.push(journal);
  const live = new PageMap();
  journal.subscribe(0, (ev) => live.fold(ev));
  for (const e of events) expect((await journal.append(e)).status).toBe('applied');
  const rebuilt = new PageMap();
  const head = await journal.headSeq();
  const state = new StartState();
  await state.foldJournal(journal, head);
  await rebuilt.rebuild(journal, await roomsInFlight(journal), head, state.pools.values());
  return { live, rebuilt };
}

describe('the page map rebuilt from the journal', () => {
  it('holds the pages of the rooms in flight, as the map that folded every event does', async () => {
    const { live, rebuilt } = await journalOf([
      registered('d0', 'i1'),
      registered('p0', 'j1', 'prefill'),
      ...room('r1', [0, 1, 2, 3], 3), // bootstrapped, in flight
      ...room('r2', [4, 5], 10), // completed, released
      ...room('r3', [6], 1), // created only
      // A new control plane: the engines say hello again under the same incarnations.
      registered('d0', 'i1'),
      ...room('r4', [6, 7], 5), // in flight, bootstrapped after the second hello
    ]);
    expect(live.heldOn('d0')).toBe(6);
    expect(rebuilt.heldOn('d0')).toBe(6);
    expect(rebuilt.conflicts).toBe(0);
    // A page of a room in flight, reserved for another room, is a conflict for the rebuilt map too.
    const [conflict] = rebuilt.fold({
      seq: 1_000,
      ts: 0,
      type: 'room.bootstrapped',
      room: 'r5',
      engine: 'd0',
      source: 'd0',
      eventId: 'x',
      data: { pages: [2] },
    } as never);
    expect(conflict).toMatchObject({ page: 2, room: 'r5', heldBy: 'r1' });
  });

  it('drops the pages of a pool its decode engine has replaced', async () => {
    const { live, rebuilt } = await journalOf([
      registered('d0', 'i1'),
      ...room('r1', [0, 1, 2, 3], 3),
      registered('d0', 'i2'), // restarted: a new, empty pool
      ...room('r2', [0, 1], 3),
    ]);
    expect(live.heldOn('d0')).toBe(2);
    expect(rebuilt.heldOn('d0')).toBe(2);
    expect(rebuilt.conflicts).toBe(0);
  });

  it('holds the reservations of rooms not yet bootstrapped, and chooses around them', async () => {
    const { live, rebuilt } = await journalOf([
      registered('d0', 'i1'),
      ...room('r1', [0, 1], 3, 'i1'), // reserved and bootstrapped
      ...room('r2', [2, 3, 4], 1, 'i1'), // reserved only
      ...room('r3', [5], 10, 'i1'), // completed, released
    ]);
    expect(live.heldOn('d0')).toBe(5);
    expect(rebuilt.heldOn('d0')).toBe(5);
    expect(rebuilt.conflicts).toBe(0);
    expect(rebuilt.reserve('r4', { engine: 'd0', incarnation: 'i1', pages: 8 }, 3)).toEqual([
      5, 6, 7,
    ]);
  });
});
