/** Which events of a room go to an engine at once, and which may wait for its next frame. */
import { describe, expect, it } from 'vitest';
import { lifecycle } from '../../../test/helpers/events.ts';
import type { JournalEvent } from '../../room/events.ts';
import { type Room, reduce } from '../../room/reducer.ts';
import { actsOn } from './acts-on.ts';

/** A room's whole life, each event with the room as folded with it. */
function life(): Array<{ ev: JournalEvent; room: Room }> {
  let room: Room | null = null;
  return lifecycle('r', 'p', 'd').map((input, i) => {
    const ev = {
      ...input,
      seq: i + 1,
      ts: 1_000 + i,
      engine: input.engine ?? null,
    } as JournalEvent;
    const r = reduce(room, ev);
    if (!r.ok) throw new Error(`${ev.type} does not fold: ${r.reason}`);
    room = r.room;
    return { ev, room };
  });
}

describe('actsOn', () => {
  it('sends each engine at once what starts or stops its work, and lets the rest wait', () => {
    const at = (engine: string) =>
      life()
        .filter(({ ev, room }) => actsOn(engine, room, ev))
        .map(({ ev }) => `${ev.type}${ev.type === 'room.released' ? ` by ${ev.engine}` : ''}`);
    expect(at('p')).toEqual(['room.created', 'room.bootstrapped', 'room.transfer_completed']);
    // The prefill engine's release goes to the decode engine at once (by rule 7 it may free the
    // decode engine's pages); nothing goes at once to an engine whose own release is committed.
    expect(at('d')).toEqual([
      'room.created',
      'room.bootstrapped',
      'room.transfer_completed',
      'room.released by p',
      'room.completed',
    ]);
  });
});
