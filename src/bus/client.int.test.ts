/**
 * The engine's bus client against a real ROUTER: it says hello once per connection — when the
 * connection's handshake completes — not once before connecting and again after, which made the
 * control plane register an engine and at once take it for a reconnection; and a control plane
 * that comes up late does not find a hello for every retry waiting in the socket.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { waitFor } from '../../test/helpers/wait.ts';
import { silentLogger } from '../log.ts';
import { freePort } from '../net.ts';
import { newKeyPair } from './admission.ts';
import { BusClient } from './client.ts';
import { type EngineMessage, PROTOCOL_VERSION } from './protocol.ts';
import { BusServer } from './server.ts';

const closers: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of closers.splice(0).reverse()) await c();
});

function hello(): EngineMessage<'hello'> {
  return {
    protocol: PROTOCOL_VERSION,
    engine: 'decode-0',
    role: 'decode',
    incarnation: 'i1',
    pid: process.pid,
    pages: 1,
    pageBytes: 4096,
    pool: '/none',
    epoch: 1,
    lastSeq: 0,
    rooms: [],
  };
}

async function hellosOnConnect(curve: boolean): Promise<number> {
  const serverKeys = newKeyPair();
  const clientKeys = newKeyPair();
  let hellos = 0;
  const server = await BusServer.bind(
    {
      endpoint: 'tcp://127.0.0.1:0',
      log: silentLogger,
      curve: curve ? { ...serverKeys, allow: (k) => k === clientKeys.publicKey } : undefined,
    },
    {
      hello: () => hellos++,
      heartbeat: () => {},
      append: () => {},
      tokens: () => {},
    },
  );
  closers.push(() => server.close());
  const client = new BusClient(
    {
      endpoints: [server.endpoint],
      engine: 'decode-0',
      incarnation: 'i1',
      curve: curve ? { ...clientKeys, serverKey: serverKeys.publicKey } : undefined,
      // Never welcomed here: a retry would be a second hello, so it is pushed out of the test.
      helloRetryMs: 60_000,
      log: silentLogger,
    },
    { hello, welcome: () => {}, event: () => {}, command: () => {} },
  );
  closers.push(() => client.close());
  client.start();
  await waitFor('the first hello', () => hellos >= 1, 5000);
  // Anything queued before the connection would have arrived with it.
  await new Promise((r) => setTimeout(r, 300));
  return hellos;
}

describe('the engine bus client', () => {
  it('keeps one hello waiting while the control plane is away, not one per retry', async () => {
    // Found by the simulator (--faults control-kill, seed 17): retried every second into a
    // socket that was not connected, the hellos piled up in it; the control plane, back after
    // 6 s, got them all at once, throttled them, and its ladder reset every engine in place.
    const endpoint = `tcp://127.0.0.1:${await freePort()}`;
    const client = new BusClient(
      {
        endpoints: [endpoint],
        engine: 'decode-0',
        incarnation: 'i1',
        helloRetryMs: 50,
        log: silentLogger,
      },
      { hello, welcome: () => {}, event: () => {}, command: () => {} },
    );
    closers.push(() => client.close());
    client.start();
    // Twenty retries' worth of time with nobody listening.
    await new Promise((r) => setTimeout(r, 1000));
    let hellos = 0;
    const server = await BusServer.bind(
      { endpoint, log: silentLogger },
      { hello: () => hellos++, heartbeat: () => {}, append: () => {}, tokens: () => {} },
    );
    closers.push(() => server.close());
    await waitFor('the first hello', () => hellos >= 1, 5000);
    // What waited in the socket arrives at once; then the retries of a hello nobody welcomes
    // come one per 50 ms.
    await new Promise((r) => setTimeout(r, 20));
    expect(hellos).toBeLessThanOrEqual(2);
  });

  it('says hello once when it connects (no CURVE)', async () => {
    expect(await hellosOnConnect(false)).toBe(1);
  });

  it('says hello once when it connects (CURVE)', async () => {
    expect(await hellosOnConnect(true)).toBe(1);
  });
});
