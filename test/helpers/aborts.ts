/** What the abort tests share: the event that puts a room in each live state, and where an abort landed. */
import type { JournalEvent } from '../../src/room/events.ts';
import { fold } from '../../src/room/reducer.ts';
import { LIVE_STATES, type LiveState } from '../../src/room/states.ts';

export const ENTERED_BY: Record<LiveState, string> = {
  created: 'room.created',
  bootstrapping: 'room.bootstrap_started',
  waiting_for_input: 'room.bootstrapped',
  prefilling: 'room.prefill_started',
  transferring: 'room.transfer_posted',
  transferred: 'room.transfer_completed',
  decoding: 'room.decode_started',
};

/** The state the room was in when its abort_requested was applied. */
export function stateAtAbort(events: JournalEvent[]): string | undefined {
  const i = events.findIndex((e) => e.type === 'room.abort_requested');
  return fold(events.slice(0, i)).rooms.get(events[0]?.room as string)?.state;
}

/**
 * The live states a room rests in between two commits, where an abort can find it. Not
 * `bootstrapping`: the decode engine sends `room.bootstrap_started` and `room.bootstrapped` in one
 * turn and they commit in one transaction (one round trip fewer on every room's path).
 */
export const RESTING_STATES = LIVE_STATES.filter((s) => s !== 'bootstrapping');

/** Whether `room.bootstrapped` came right after `room.bootstrap_started` (one commit). */
export function bootstrappedAtOnce(events: JournalEvent[]): boolean {
  const i = events.findIndex((e) => e.type === 'room.bootstrap_started');
  const next = events[i + 1];
  return i >= 0 && next?.type === 'room.bootstrapped' && next.seq === (events[i]?.seq ?? 0) + 1;
}
