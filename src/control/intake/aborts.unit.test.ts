/**
 * The abort decider, given/when/then on data: the pending aborts and the rooms folded by the real
 * reducer from the events below; no journal, no timers.
 */
import { describe, expect, it } from 'vitest';
import { foldRoom, roomEvent } from '../../../test/helpers/room-events.ts';
import type { JournalEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import { type AbortsState, decideAbort } from './aborts.ts';

/** The room after `events`, and the last of them (as the control plane feeds it in). */
function folded(...events: JournalEvent[]): { room: Room; event: JournalEvent } {
  return { room: foldRoom(...events), event: events.at(-1) as JournalEvent };
}

const ev = roomEvent;
const created = () => ev('room.created', { prefillEngine: 'p0', decodeEngine: 'd0' });
const asked = (source = 'api') =>
  ev('room.abort_requested', { reason: 'client_disconnect' }, null, source);
const released = (engine: string) => ev('room.released', {}, engine, `engine:${engine}`);
const none: AbortsState = new Map();

describe('decideAbort: an AbortReq ends in room.aborted', () => {
  it('given no abort, when the first request commits, then its grace starts and who asked is kept', () => {
    const { room, event } = folded(created(), asked('api'));
    const d = decideAbort(none, { kind: 'committed', room, event });
    expect(d.commands).toEqual([{ kind: 'start_grace', room: 'r1' }]);
    expect(d.state.get('r1')).toBe('api');
  });

  it('given an abort pending, when a second request commits, then nothing more starts', () => {
    const first = asked('api');
    const { room, event } = folded(created(), first, asked('client'));
    const d = decideAbort(new Map([['r1', 'api']]), { kind: 'committed', room, event });
    expect(d.commands).toEqual([]);
    expect(d.state.get('r1')).toBe('api');
  });

  it('given an abort pending, when the second engine releases, then the room is aborted with the first reason and who asked', () => {
    const pending = new Map([['r1', 'api']]);
    const one = folded(created(), asked('api'), released('p0'));
    expect(decideAbort(pending, { kind: 'committed', ...one }).commands).toEqual([]);
    const both = folded(created(), asked('api'), released('p0'), released('d0'));
    expect(decideAbort(pending, { kind: 'committed', ...both }).commands).toEqual([
      { kind: 'append_aborted', room: 'r1', reason: 'client_disconnect', source: 'api' },
    ]);
  });

  it('given no abort, when both engines release a room that ended, then nothing is appended', () => {
    const done = folded(
      created(),
      ev('room.failed', { reason: 'deadline_exceeded', stage: 'created', detectedBy: 'watchdog' }),
      released('p0'),
      released('d0'),
    );
    expect(decideAbort(none, { kind: 'committed', ...done }).commands).toEqual([]);
  });

  it('given an abort pending, when its grace is over and an engine never released, then the room is aborted', () => {
    const { room } = folded(created(), asked('client'), released('p0'));
    const pending = new Map([['r1', 'client']]);
    const d = decideAbort(pending, { kind: 'grace_over', room: 'r1', now: room });
    expect(d.commands).toEqual([
      { kind: 'append_aborted', room: 'r1', reason: 'client_disconnect', source: 'client' },
    ]);
    // Still pending until the room ends: a release on its way finishes it under the same id.
    expect(d.state.get('r1')).toBe('client');
  });

  it('given an abort pending, when its grace is over for a room that ended or left, then nothing is appended', () => {
    const pending = new Map([['r1', 'api']]);
    const ended = folded(created(), asked(), ev('room.aborted', { reason: 'x', source: 'api' }));
    expect(
      decideAbort(pending, { kind: 'grace_over', room: 'r1', now: ended.room }).commands,
    ).toEqual([]);
    expect(
      decideAbort(pending, { kind: 'grace_over', room: 'r1', now: undefined }).commands,
    ).toEqual([]);
  });

  it('given an abort pending, when the room ends, then its grace is cancelled and it is forgotten', () => {
    const d = decideAbort(new Map([['r1', 'api']]), { kind: 'ended', room: 'r1' });
    expect(d.commands).toEqual([{ kind: 'cancel_grace', room: 'r1' }]);
    expect(d.state.size).toBe(0);
    expect(decideAbort(none, { kind: 'ended', room: 'r1' }).commands).toEqual([]);
  });
});
