/** Hand-driven engines (src/drills/raw-engine.ts) for attack tests, closed when each test ends. */
import { afterEach } from 'vitest';
import { RawEngine } from '../../src/drills/raw-engine.ts';

const peers: Array<{ close(): void }> = [];
afterEach(() => {
  for (const p of peers.splice(0)) p.close();
});

/** Closes `socket` (a raw ZeroMQ socket of the test's own) when the test ends. */
export function closeAfterTest<T extends { close(): void }>(socket: T): T {
  peers.push(socket);
  return socket;
}

export function raw(o: ConstructorParameters<typeof RawEngine>[0]): RawEngine {
  return closeAfterTest(new RawEngine(o));
}
