/**
 * Bus traffic no peer should send: every shape of malformed, unknown, truncated or oversized
 * frame, including the `ABORT`-with-no-header frame of docs/incident.md. The bus-faults test and the
 * `malformed-frames` drill both throw it at a live control plane, whose loops must drop and count
 * each one and go on.
 */
import { randomBytes } from 'node:crypto';
import { encode } from 'msgpackr';

/** The named hostile messages, then `randomCount` multipart messages of random bytes. */
export function hostileFrames(randomCount = 300): Array<Array<Buffer | string>> {
  const named: Array<Array<Buffer | string>> = [
    ['ABORT'], // the frame of docs/incident.md: a kind with no header and no payload
    ['abort_room', encode({ room: 'x' })], // a command kind, from the wrong side
    [
      'append',
      encode({ eventId: 'e1', event: { type: 'room.failed', room: 'r1', data: {} } }).subarray(
        0,
        9,
      ),
    ], // truncated msgpack
    ['append', encode({ eventId: 42 })], // wrong shape
    ['hello', encode({ protocol: 'one' })],
    [
      'heartbeat',
      encode({ ticks: {}, queues: {}, freePages: 1, rooms: 0, lastSeq: 0, state: 'ready' }),
    ], // never said hello
    ['append', encode({ eventId: 'e2', event: { type: 'room.failed', room: 'r1', data: {} } })], // never said hello
    ['append', randomBytes(10 * 1024 * 1024)], // 10 MB of garbage
    ['tokens', encode({ room: 'r1' }), 'extra', 'frames'],
    [Buffer.alloc(0), Buffer.alloc(0)],
    [randomBytes(300), randomBytes(64)],
    ['batch', encode({ items: 'not a list' })],
    [
      'batch',
      encode({
        items: [
          ['append', Buffer.from([0xc1])],
          ['batch', Buffer.alloc(3)],
          ['hello', encode({})],
        ],
      }),
    ],
  ];
  for (let i = 0; i < randomCount; i++) {
    const parts = 1 + (i % 4);
    named.push(Array.from({ length: parts }, () => randomBytes(i % 97)));
  }
  return named;
}
