import { describe, expect, it } from 'vitest';
import { newRoomId, roomIdOf } from './ids.ts';

describe('room ids', () => {
  it('takes the completion id a client got for the room it names', () => {
    const room = newRoomId();
    expect(roomIdOf(room)).toBe(room);
    expect(roomIdOf(`cmpl-${room}`)).toBe(room);
    expect(roomIdOf(`chatcmpl-${room}`)).toBe(room);
    // Anything else is left as it is, to be refused (or not found) as it was.
    expect(roomIdOf('cmpl-x')).toBe('cmpl-x');
    expect(roomIdOf('xcmpl-r-1')).toBe('xcmpl-r-1');
  });
});
