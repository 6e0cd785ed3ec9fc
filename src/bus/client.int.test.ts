/**
 * The engine's bus client against a real ROUTER: it says hello once per connection — when the
 * connection's handshake completes — not once before connecting and again after, which made the
 * control plane register an engine and at once take it for a reconnection.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { waitFor } from '../../test/helpers/wait.ts';
import { silentLogger } from '../log.ts';
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
  it('says hello once when it connects (no CURVE)', async () => {
    expect(await hellosOnConnect(false)).toBe(1);
  });

  it('says hello once when it connects (CURVE)', async () => {
    expect(await hellosOnConnect(true)).toBe(1);
  });
});
