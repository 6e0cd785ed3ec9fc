/** Optional CURVE on the bus: engines with an allowed key join and serve; others never get in. */
import { describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';
import { BusClient } from '../src/bus/client.ts';
import { newKeyPair } from '../src/bus/curve.ts';
import { PROTOCOL_VERSION } from '../src/bus/protocol.ts';
import { silentLogger } from '../src/log.ts';
import { collect, prompt, startTestStack } from './helpers/stack.ts';

describe('CURVE authentication', () => {
  it('admits engines whose key is allowed and refuses an engine with another key or none', async () => {
    const server = newKeyPair();
    const engine = newKeyPair();
    const { control } = await startTestStack({
      curve: { ...server, allow: [engine.publicKey] },
      engineEnv: {
        PDCTL_CURVE_SERVER_KEY: server.publicKey,
        PDCTL_CURVE_PUBLIC_KEY: engine.publicKey,
        PDCTL_CURVE_SECRET_KEY: engine.secretKey,
      },
    });
    const ok = await collect(control.submit({ prompt: prompt(1, 10), maxTokens: 4 }));
    expect(ok.error).toBeNull();

    const hellos = control.counters.hellos;
    const rogue = newKeyPair();
    let welcomed = false;
    const client = new BusClient(
      {
        endpoint: control.endpoint,
        engine: 'rogue-0',
        incarnation: 'x',
        curve: { ...rogue, serverKey: server.publicKey },
        log: silentLogger,
      },
      {
        hello: () => ({
          protocol: PROTOCOL_VERSION,
          engine: 'rogue-0',
          role: 'decode',
          incarnation: 'x',
          pid: 1,
          pages: 1,
          pageBytes: 4096,
          pool: '/rogue',
          epoch: 1,
          lastSeq: 0,
          rooms: [],
        }),
        welcome: () => {
          welcomed = true;
        },
        event: () => {},
        command: () => {},
      },
    );
    client.start();
    const plain = new zmq.Dealer({ linger: 0 });
    plain.connect(control.endpoint);
    await plain.send(['hello', Buffer.from('x')]);
    await new Promise((r) => setTimeout(r, 1500));
    expect(welcomed).toBe(false);
    expect(control.counters.hellos).toBe(hellos);
    expect(control.bus.zapDenied).toBeGreaterThan(0);
    expect(control.registry.get('rogue-0')).toBeUndefined();
    await client.close();
    plain.close();
  });
});
