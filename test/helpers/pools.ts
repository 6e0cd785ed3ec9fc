/** Host KV pools for transfer tests, unlinked from /dev/shm when the test file ends. */
import { afterAll } from 'vitest';
import { KvPool } from '../../src/transfer/pool.ts';

/**
 * A maker of pools named `/pdctl-<kind>-<pid>-<n>`; `names` lists them (a test that makes a pool
 * of its own adds its name there to have it unlinked too).
 */
export function testPools(kind: string) {
  let n = 0;
  const names: string[] = [];
  afterAll(() => {
    for (const name of names) KvPool.unlink(name);
  });
  const pool = (pages = 64, pageBytes = 4096) => {
    const name = `/pdctl-${kind}-${process.pid}-${n++}`;
    names.push(name);
    return KvPool.create({ name, pages, pageBytes });
  };
  return { pool, names };
}
