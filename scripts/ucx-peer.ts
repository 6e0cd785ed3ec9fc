/**
 * The receiving side of a UCX transfer, run on a test host (test/ucx-hosts.e2e.test.ts,
 * test/attacks/ucx-memory.e2e.test.ts and `npm run bench:transfer -- --transport ucx`): opens a
 * UCX node as a decode engine does, makes a pool of PAGES × PAGE_BYTES in its host's /dev/shm,
 * prints the descriptor a decode engine's hello carries (and its pid and pool name) as one JSON
 * line, then answers one line for each command:
 *   recv ROOM P,P,…     posts the room's receive into those pages; `posted ROOM`, and later
 *                       `received ROOM STATUS` when it ends
 *   rounds N K PAGES    for the bandwidth bench: N rounds of K receives (`bench-R-k`) of PAGES
 *                       pages each (slice k of the pool, in reverse order), all posted at once;
 *                       `rounds done` when every one ended
 *   singles N           for the latency bench: N receives (`lat-i`) of one page each, all posted
 *                       at once; `singles done` when every one ended
 *   cancel ROOM         `cancelled ROOM N`
 *   checksum P,P,…      the CRC32C of those pages
 *   ls                  its /dev/shm
 *   exit
 */
import { readdirSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { KvPool } from '../src/transfer/pool.ts';
import { UcxNode } from '../src/transfer/ucx.ts';

const [pages, pageBytes] = process.argv.slice(2).map(Number) as [number, number];
const name = `/pdctl-ucx-peer-${process.pid}`;
const pool = KvPool.create({ name, pages, pageBytes });
const node = UcxNode.open();
const d = node.describe(pool);
const say = (line: string) => process.stdout.write(`${line}\n`);
say(
  JSON.stringify({
    address: d.address.toString('base64'),
    pageBytes: d.pageBytes,
    pages: d.pages,
    epoch: d.epoch,
    pool: name,
    pid: process.pid,
  }),
);
const list = (arg = '') => arg.split(',').map(Number);

/** Posts every receive at once; resolves when all ended `ok`, throws on the first that did not. */
async function receiveAll(receives: Array<{ room: string; pages: number[] }>): Promise<void> {
  const results = await Promise.all(receives.map((r) => node.receive({ ...r, pool })));
  const bad = results.find((r) => r.status !== 'ok');
  if (bad) throw new Error(`receive ${bad.status}: ${bad.error ?? ''}`);
}

/** Every round's receives (rounds reuse the pages). */
function rounds(n: number, k: number, each: number): Promise<void> {
  return receiveAll(
    Array.from({ length: n * k }, (_, j) => ({
      room: `bench-${Math.floor(j / k)}-${j % k}`,
      // Reversed within the slice: every page a piece of its own, as a room's scattered pages.
      pages: Array.from({ length: each }, (_, p) => (j % k) * each + (each - 1 - p)),
    })),
  );
}

function singles(n: number): Promise<void> {
  return receiveAll(
    Array.from({ length: n }, (_, i) => ({ room: `lat-${i}`, pages: [(i * 3) % pool.pages] })),
  );
}

for await (const line of createInterface({ input: process.stdin })) {
  const [cmd, a, b, c] = line.trim().split(' ');
  if (cmd === 'recv') {
    const room = a as string;
    void node
      .receive({ room, pool, pages: list(b) })
      .then((r) => say(`received ${room} ${r.status}`));
    say(`posted ${room}`);
  } else if (cmd === 'rounds')
    void rounds(Number(a), Number(b), Number(c)).then(() => say('rounds done'));
  else if (cmd === 'singles') void singles(Number(a)).then(() => say('singles done'));
  else if (cmd === 'cancel') say(`cancelled ${a} ${node.cancel(a as string)}`);
  else if (cmd === 'checksum') say(`checksum ${pool.checksumPages(list(a))}`);
  else if (cmd === 'ls') say(`ls ${readdirSync('/dev/shm').join(',')}`);
  else if (cmd === 'exit') break;
}
await node.close();
pool.close();
KvPool.unlink(name);
