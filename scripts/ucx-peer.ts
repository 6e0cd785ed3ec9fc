/**
 * The receiving side of a UCX transfer, run on a test host (test/ucx-hosts.e2e.test.ts and
 * `npm run bench:transfer -- --transport ucx`): makes a pool of PAGES × PAGE_BYTES in its host's
 * /dev/shm, registers it with a UCX node, prints the descriptor as one JSON line, then answers
 * `checksum P,P,…` (the CRC32C of those pages), `ls` (its /dev/shm) and `exit`.
 */
import { readdirSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { KvPool } from '../src/transfer/pool.ts';
import { UcxNode } from '../src/transfer/ucx.ts';

const [pages, pageBytes] = process.argv.slice(2).map(Number) as [number, number];
const name = `/pdctl-ucx-peer-${process.pid}`;
const pool = KvPool.create({ name, pages, pageBytes });
const node = UcxNode.open();
const d = node.register(pool);
console.log(
  JSON.stringify({
    address: d.address.toString('base64'),
    rkey: d.rkey.toString('base64'),
    base: d.base,
    pageBytes: d.pageBytes,
    pages: d.pages,
    epoch: d.epoch,
    pool: name,
  }),
);
for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, arg] = line.trim().split(' ');
  if (cmd === 'checksum')
    console.log(`checksum ${pool.checksumPages((arg ?? '').split(',').map(Number))}`);
  else if (cmd === 'ls') console.log(`ls ${readdirSync('/dev/shm').join(',')}`);
  else if (cmd === 'exit') break;
}
await node.close();
pool.close();
KvPool.unlink(name);
