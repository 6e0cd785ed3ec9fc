/**
 * The outbox on a virtual clock, its socket a recorder of what it is handed (the socket is not
 * under test): lazy messages wait for a frame that goes to their peer anyway, or for LAZY_MS.
 */
import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../log.ts';
import { VirtualClock } from '../sim/world/clock.ts';
import { LAZY_MS, Outbox } from './outbox.ts';
import { BATCH_KIND } from './protocol.ts';

const packr = new Packr({ useRecords: false, mapsAsObjects: true, moreTypes: false });

/** What the outbox handed its socket, each frame as [peer, kinds in it]. */
function recorder() {
  const frames: Array<[string, string[]]> = [];
  const socket = {
    closed: false,
    send: async (msg: Array<Buffer | string>) => {
      const [peer, kind, body] = msg as [Buffer, string | Buffer, Buffer];
      const kinds =
        String(kind) === BATCH_KIND
          ? (packr.unpack(body) as { items: Array<[string, Buffer]> }).items.map(([k]) => k)
          : [String(kind)];
      frames.push([peer.toString(), kinds]);
    },
  };
  return { socket, frames };
}

const peer = (name: string) => Buffer.from(name);
const body = Buffer.from([0x80]); // an empty msgpack map

describe('outbox', () => {
  it('sends a lazy message in the next frame to its peer, in order, and another peer’s alone after LAZY_MS', async () => {
    const clock = new VirtualClock();
    const { socket, frames } = recorder();
    const out = new Outbox(socket, silentLogger, 'test', clock);
    out.push(peer('a'), 'ack', body, true);
    out.push(peer('b'), 'ack', body, true);
    await clock.run(LAZY_MS - 1);
    expect(frames).toEqual([]);
    out.push(peer('a'), 'event', body);
    await clock.run(0);
    expect(frames).toEqual([['a', ['ack', 'event']]]);
    expect(out.depth).toBe(1);
    await clock.run(1);
    expect(frames).toEqual([
      ['a', ['ack', 'event']],
      ['b', ['ack']],
    ]);
    expect(out.depth).toBe(0);
  });

  it('sends what is not lazy at once, and a lazy message alone within LAZY_MS', async () => {
    const clock = new VirtualClock();
    const { socket, frames } = recorder();
    const out = new Outbox(socket, silentLogger, 'test', clock);
    out.push(peer('a'), 'event', body);
    out.push(peer('a'), 'ack', body, true);
    await clock.run(0);
    expect(frames).toEqual([['a', ['event', 'ack']]]);
    out.push(peer('a'), 'ack', body, true);
    await clock.run(LAZY_MS - 1);
    expect(frames).toHaveLength(1);
    await clock.run(1);
    expect(frames).toEqual([
      ['a', ['event', 'ack']],
      ['a', ['ack']],
    ]);
    // The wait starts again with the next lazy message.
    out.push(peer('a'), 'ack', body, true);
    await clock.run(LAZY_MS - 1);
    expect(frames).toHaveLength(2);
    await clock.run(1);
    expect(frames).toHaveLength(3);
  });
});
