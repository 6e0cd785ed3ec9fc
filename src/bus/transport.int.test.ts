import { afterEach, describe, expect, it } from 'vitest';
import { systemClock } from '../ports/clock.ts';
import { seeded } from '../ports/random.ts';
import { VirtualClock } from '../sim/world/clock.ts';
import { MemoryNetwork } from '../sim/world/network.ts';
import {
  type BusTransport,
  type DealerSocket,
  type RouterSocket,
  zmqTransport,
} from './transport.ts';

const sockets: Array<RouterSocket | DealerSocket> = [];
afterEach(() => {
  for (const s of sockets.splice(0)) s.close();
});

function router(t: BusTransport): RouterSocket {
  const s = t.router({ maxMessageSize: 1 << 20 });
  sockets.push(s);
  return s;
}

function dealer(t: BusTransport, routingId: string): DealerSocket {
  const s = t.dealer({ routingId, heartbeatTimeoutMs: 5000 });
  sockets.push(s);
  return s;
}

/** The next event of `type`; ZeroMQ also reports steps on the way (connect, connect:retry…). */
async function next(d: DealerSocket, type: string): Promise<void> {
  for (let ev = await d.nextEvent(); ev.type !== type; ev = await d.nextEvent());
}

const adapters: Array<[string, () => { cp: BusTransport; engine: BusTransport }]> = [
  ['ZeroMQ', () => ({ cp: zmqTransport, engine: zmqTransport })],
  [
    'the in-memory network',
    () => {
      const net = new MemoryNetwork(systemClock, seeded(1));
      return { cp: net.host('cp'), engine: net.host('e0') };
    },
  ],
];

describe.each(adapters)('the bus transport over %s', (_name, make) => {
  it('connects, carries frames both ways with the routing id, and refuses an unknown peer', async () => {
    const { cp, engine } = make();
    const r = router(cp);
    await r.bind('tcp://127.0.0.1:0');
    expect(r.lastEndpoint).toBeTruthy();
    const d = dealer(engine, 'engine-a/1');
    d.connect(r.lastEndpoint as string);
    // Sent before the handshake: it leaves once connected.
    await d.send(['hello', Buffer.from('{}')]);
    await next(d, 'handshake');
    const [id, kind, body] = await r.receive();
    expect(id?.toString('latin1')).toBe('engine-a/1');
    expect([kind?.toString(), body?.toString()]).toEqual(['hello', '{}']);
    for (let i = 0; i < 5; i++) await r.send([id as Buffer, 'event', String(i)]);
    const got: string[] = [];
    for (let i = 0; i < 5; i++) got.push(((await d.receive())[1] as Buffer).toString());
    expect(got).toEqual(['0', '1', '2', '3', '4']);
    await expect(r.send(['nobody', 'event', 'x'])).rejects.toMatchObject({ code: 'EHOSTUNREACH' });
  });

  it('tells the DEALER when the ROUTER goes away, and connects again when one binds there', async () => {
    const { cp, engine } = make();
    const r = router(cp);
    await r.bind('tcp://127.0.0.1:0');
    const at = r.lastEndpoint as string;
    const d = dealer(engine, 'engine-b/1');
    d.connect(at);
    await next(d, 'handshake');
    r.close();
    await next(d, 'disconnect');
    const again = router(cp);
    await again.bind(at);
    await next(d, 'handshake');
    await d.send(['heartbeat', '{}']);
    expect((await again.receive())[1]?.toString()).toBe('heartbeat');
  });
});

describe('the in-memory network', () => {
  it('holds what crosses a partition healed in time, and drops the connection of one that lasts', async () => {
    const clock = new VirtualClock(0);
    const net = new MemoryNetwork(clock, seeded(7));
    const r = net.host('cp').router({ maxMessageSize: 1 << 20 });
    await r.bind('mem://cp');
    const d = net.host('e0').dealer({ routingId: 'e0/1', heartbeatTimeoutMs: 5000 });
    d.connect('mem://cp');
    const events: string[] = [];
    const watch = async () => {
      for (;;) events.push((await d.nextEvent()).type);
    };
    void watch().catch(() => {});
    const received: string[] = [];
    const read = async () => {
      for (;;) received.push(((await r.receive())[2] as Buffer).toString());
    };
    void read().catch(() => {});
    const settle = (ms: number) => clock.run(ms);
    await settle(10);
    expect(events).toEqual(['handshake']);
    net.partition('cp', 'e0');
    await d.send(['during', 'a']);
    await settle(3000);
    expect(received).toEqual([]);
    net.heal('cp', 'e0');
    await settle(10);
    expect(received).toEqual(['a']);
    expect(events).toEqual(['handshake']);
    net.partition('cp', 'e0');
    await d.send(['lost', 'b']);
    await settle(6000);
    expect(events).toEqual(['handshake', 'disconnect']);
    await expect(r.send([Buffer.from('e0/1'), 'x'])).rejects.toMatchObject({
      code: 'EHOSTUNREACH',
    });
    net.heal('cp', 'e0');
    await settle(500);
    expect(events).toEqual(['handshake', 'disconnect', 'handshake']);
    expect(received).toEqual(['a']);
    r.close();
    d.close();
  });
});
