/** Loopback networking helpers shared by drills, the PostgreSQL cluster and tests. */
import { createServer } from 'node:net';

/** A TCP port free on loopback a moment ago, for a process to listen on next. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as { port: number };
      srv.close(() => resolve(port));
    });
  });
}
