/**
 * The other process of the pool test: creates a pool, fills every page with a known pattern,
 * prints `{ epoch, checksums }` as one JSON line, then waits to be told to exit (so that the pool
 * outlives nothing but this process's mapping). A fourth argument makes it a pool on that CUDA
 * device, filled with write() (the runtime is the one PDCTL_CUDART names, if set).
 */
import { KvPool } from '../../src/transfer/pool.ts';
import { patternByte } from './page-pattern.ts';

const [name, pages, pageBytes, device] = process.argv.slice(2);
const pool = KvPool.create({
  name: name as string,
  pages: Number(pages),
  pageBytes: Number(pageBytes),
  ...(device === undefined ? {} : { device: Number(device) }),
});
const checksums: string[] = [];
for (let i = 0; i < pool.pages; i++) {
  const page = pool.device === null ? pool.page(i) : new Uint8Array(pool.pageBytes);
  for (let j = 0; j < page.length; j++) page[j] = patternByte(i, j);
  if (pool.device !== null) pool.write(i, page);
  checksums.push(pool.checksum(i));
}
process.stdout.write(
  `${JSON.stringify({ epoch: pool.epoch, checksums, all: pool.checksum(0, pool.pages) })}\n`,
);
process.stdin.once('data', () => process.exit(0));
