/**
 * The sending side of `npm run bench:transfer -- --transport ucx`, run on test host a: reads the
 * receiver's descriptor (scripts/ucx-peer.ts, one JSON line) from stdin, then answers each command
 * with one JSON line:
 *   bw BYTES     GB/s of UcxNode.post moving BYTES, 16 transfers in flight, each a slice of the pool
 *   lat N        p50/p99 µs of N single-page transfers, one at a time, post → completion
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
  rkey: Buffer.from(desc.rkey as string, 'base64'),
  base: desc.base as number,
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

async function bandwidth(bytes: number) {
  const perTransfer = Math.max(1, src.pages / 16);
  const rounds = Math.max(1, Math.round(bytes / (src.pages * src.pageBytes)));
  const t0 = process.hrtime.bigint();
  for (let round = 0; round < rounds; round++) {
    const results = await Promise.all(
      Array.from({ length: Math.ceil(src.pages / perTransfer) }, (_, k) =>
        node.post({
          room: `bench-${k}`,
          src,
          dst,
          pairs: Array.from({ length: perTransfer }, (_, i) => {
            const p = k * perTransfer + i;
            return [p, p] as [number, number];
          }),
          deadlineMs: 60_000,
        }),
      ),
    );
    const bad = results.find((r) => r.status !== 'ok');
    if (bad) throw new Error(`transfer ${bad.status}: ${bad.error ?? ''}`);
  }
  const ns = Number(process.hrtime.bigint() - t0);
  return { gbPerSec: (rounds * src.pages * src.pageBytes) / ns };
}

async function latency(n: number) {
  const micros: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = process.hrtime.bigint();
    const r = await node.post({
      room: 'bench-latency',
      src,
      dst,
      pairs: [[i % src.pages, (i * 3) % dst.pages]],
      deadlineMs: 10_000,
    });
    if (r.status !== 'ok') throw new Error(`transfer ${r.status}: ${r.error ?? ''}`);
    micros.push(Number(process.hrtime.bigint() - t) / 1000);
  }
  micros.sort((a, b) => a - b);
  return { p50Micros: percentile(micros, 50), p99Micros: percentile(micros, 99) };
}
