/**
 * The sending side of `npm run bench:transfer -- --transport ucx`, run on test host a: reads the
 * receiver's descriptor (scripts/ucx-peer.ts, one JSON line) from stdin, then answers each command
 * with one JSON line (the receiver has posted the matching receives: `rounds`, `singles`):
 *   bw BYTES     GB/s of UcxNode.post moving BYTES, 16 transfers always in flight, each a slice of
 *                the pool, sent round after round (`bench-ROUND-k`)
 *   lat N        p50/p99 µs of N single-page transfers (`lat-i`), one at a time, post → matched
 *   exit
 */
import { createInterface } from 'node:readline';
import { KvPool } from '../src/transfer/pool.ts';
import { UcxNode, type UcxPoolDescriptor } from '../src/transfer/ucx.ts';
import { percentile } from './args.ts';

const input = createInterface({ input: process.stdin });
const lines = input[Symbol.asyncIterator]();
const first = await lines.next();
const desc = JSON.parse(String(first.value)) as Record<string, string | number>;
const dst: UcxPoolDescriptor = {
  address: Buffer.from(desc.address as string, 'base64'),
  pageBytes: desc.pageBytes as number,
  pages: desc.pages as number,
  epoch: desc.epoch as number,
};
const name = `/pdctl-bench-ucx-${process.pid}`;
const src = KvPool.create({ name, pages: dst.pages, pageBytes: dst.pageBytes, replace: true });
for (let i = 0; i < src.pages; i++) src.page(i).fill(i & 0xff);
const node = UcxNode.open();
const say = (x: unknown) => process.stdout.write(`${JSON.stringify(x)}\n`);

try {
  for (;;) {
    const next = await lines.next();
    if (next.done) break;
    const [cmd, arg] = String(next.value).trim().split(' ');
    if (cmd === 'bw') say(await bandwidth(Number(arg)));
    else if (cmd === 'lat') say(await latency(Number(arg)));
    else break;
  }
} finally {
  input.close();
  await node.close();
  src.close();
  KvPool.unlink(name);
}

/**
 * 16 lanes, each sending its slice of the pool round after round (`bench-ROUND-k`): always 16
 * messages in flight, as ucx_perftest keeps its window full.
 */
async function bandwidth(bytes: number) {
  const lanes = 16;
  const perTransfer = Math.max(1, src.pages / lanes);
  const rounds = Math.max(1, Math.round(bytes / (src.pages * src.pageBytes)));
  const lane = async (k: number) => {
    for (let round = 0; round < rounds; round++) {
      const r = await node.post({
        room: `bench-${round}-${k}`,
        src,
        pages: Array.from({ length: perTransfer }, (_, i) => k * perTransfer + i),
        dst,
        deadlineMs: 60_000,
      });
      if (r.status !== 'ok') throw new Error(`transfer ${r.status}: ${r.error ?? ''}`);
    }
  };
  const t0 = process.hrtime.bigint();
  await Promise.all(Array.from({ length: lanes }, (_, k) => lane(k)));
  const ns = Number(process.hrtime.bigint() - t0);
  return { gbPerSec: (rounds * src.pages * src.pageBytes) / ns };
}

async function latency(n: number) {
  const micros: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    const r = await node.post({
      room: `lat-${i}`,
      src,
      pages: [i % src.pages],
      dst,
      deadlineMs: 10_000,
    });
    if (r.status !== 'ok') throw new Error(`transfer ${r.status}: ${r.error ?? ''}`);
    micros.push(Number(process.hrtime.bigint() - t) / 1000);
  }
  micros.sort((a, b) => a - b);
  return { p50Micros: percentile(micros, 50), p99Micros: percentile(micros, 99) };
}
