/** Event builders shared by the journal tests. */

import { completedRoomEvents } from '../../src/journal/synth.ts';
import type { EventInput } from '../../src/room/events.ts';

export function lifecycle(room: string, p = 'p0', d = 'd0'): EventInput[] {
  return completedRoomEvents(room, p, d, 'test');
}

export function created(room: string, ts?: number): EventInput {
  return {
    type: 'room.created',
    room,
    source: 'test',
    ...(ts !== undefined ? { ts } : {}),
    data: { prefillEngine: 'p0', decodeEngine: 'd0' },
  };
}
