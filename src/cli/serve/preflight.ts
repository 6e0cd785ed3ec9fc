/** What `pdctl serve` checks before it opens anything: a taken HTTP port is known at once. */
import { createServer } from 'node:net';
import { UsageError } from '../../errors.ts';

/** Refuses a host and port another process listens on (port 0: any free one, always). */
export async function httpPortFree(host: string, port: number): Promise<void> {
  if (port === 0) return;
  const probe = createServer();
  await new Promise<void>((resolve, reject) => {
    probe.once('error', (err) =>
      reject(
        new UsageError(`cannot listen on ${host}:${port}: ${err.message}; pass another --port`),
      ),
    );
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve()));
  });
}
