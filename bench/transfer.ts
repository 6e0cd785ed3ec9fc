/**
 * Transfer-core benchmark: GB/s of the transfer core for 4 KiB, 64 KiB and 1 MiB pages, contiguous
 * and scattered page lists, 1 and 2 worker threads, against a bare memcpy of the same bytes
 * measured by the addon in the same run; and p50/p99 completion latency of a single-page transfer.
 *
 *   npm run bench:transfer                 # a table
 *   npm run bench:transfer -- --json       # one JSON object with stable keys
 */
import { NativeTransferCore } from '../src/transfer/core.ts';
import { native } from '../src/transfer/native.ts';
import { KvPool } from '../src/transfer/pool.ts';

const asJson = process.argv.includes('--json');
const TOTAL_BYTES = 64 * 2 ** 20; // per pool
const ROUNDS_BYTES = 1024 * 2 ** 20; // bytes moved per measurement
const names: string[] = [];
const pool = (pageBytes: number) => {
  const name = `/pdctl-bench-${process.pid}-${names.length}`;
  names.push(name);
  return KvPool.create({ name, pages: TOTAL_BYTES / pageBytes, pageBytes });
};
process.on('exit', () => {
  for (const n of names) KvPool.unlink(n);
});
const log = (s: string) => {
  if (!asJson) process.stderr.write(`${s}\n`);
};

interface Row {
  pageBytes: number;
  layout: 'contiguous' | 'scattered';
  threads: number;
  gbPerSec: number;
  memcpyGbPerSec: number;
  ratio: number;
}

const rows: Row[] = [];
for (const pageBytes of [4096, 65536, 1 << 20]) {
  const src = pool(pageBytes);
  const dst = pool(pageBytes);
  for (let i = 0; i < src.pages; i++) src.page(i).fill(i & 0xff);
  const rounds = ROUNDS_BYTES / TOTAL_BYTES;
  native().memcpyNanos(src.handleForTransfer(), dst.handleForTransfer(), TOTAL_BYTES, 1); // warm the pages
  const memcpyNs = native().memcpyNanos(
    src.handleForTransfer(),
    dst.handleForTransfer(),
    TOTAL_BYTES,
    rounds,
  );
  const memcpyGbPerSec = ROUNDS_BYTES / memcpyNs;
  for (const layout of ['contiguous', 'scattered'] as const) {
    // Scattered: destination pages in a shuffled order, so no two neighbours stay neighbours.
    const order = Array.from({ length: dst.pages }, (_, i) => i);
    if (layout === 'scattered') {
      for (let i = order.length - 1; i > 0; i--) {
        const j = (i * 7919) % (i + 1);
        [order[i], order[j]] = [order[j] as number, order[i] as number];
      }
    }
    // Split the pool into 16 transfers, so that two threads have work to share.
    const perTransfer = src.pages / 16;
    for (const threads of [1, 2]) {
      log(`transfer: ${pageBytes} B pages, ${layout}, ${threads} thread(s)`);
      const core = new NativeTransferCore({ threads });
      const t0 = process.hrtime.bigint();
      for (let round = 0; round < rounds; round++) {
        await Promise.all(
          Array.from({ length: 16 }, (_, k) => {
            const pairs = Array.from(
              { length: perTransfer },
              (_, i) =>
                [k * perTransfer + i, order[k * perTransfer + i] as number] as [number, number],
            );
            return core.post({ room: `bench-${k}`, src, dst, pairs, deadlineMs: 60_000 });
          }),
        );
      }
      const ns = Number(process.hrtime.bigint() - t0);
      await core.close();
      const gbPerSec = ROUNDS_BYTES / ns;
      rows.push({
        pageBytes,
        layout,
        threads,
        gbPerSec: round2(gbPerSec),
        memcpyGbPerSec: round2(memcpyGbPerSec),
        ratio: round2(gbPerSec / memcpyGbPerSec),
      });
    }
  }
  src.close();
  dst.close();
}

function round2(x: number): number {
  return Math.round(x * 100) / 100;
}

// Completion latency of one 64 KiB page: post to promise resolved, one at a time.
log('latency: single 64 KiB page transfers');
const src = pool(65536);
const dst = pool(65536);
const core = new NativeTransferCore({ threads: 1 });
const latencies: number[] = [];
for (let i = 0; i < 5000; i++) {
  const t = process.hrtime.bigint();
  await core.post({
    room: 'bench-latency',
    src,
    dst,
    pairs: [[i % src.pages, (i * 3) % dst.pages]],
    deadlineMs: 10_000,
  });
  latencies.push(Number(process.hrtime.bigint() - t) / 1000);
}
await core.close();
latencies.sort((a, b) => a - b);
const pct = (p: number) =>
  round2(
    latencies[Math.min(latencies.length - 1, Math.floor((latencies.length * p) / 100))] as number,
  );
const latency = { transfers: latencies.length, p50Micros: pct(50), p99Micros: pct(99) };

const result = {
  backends: native().backends(),
  bytesPerMeasurement: ROUNDS_BYTES,
  throughput: rows,
  singlePageLatency: latency,
};
if (asJson) {
  process.stdout.write(`${JSON.stringify(result)}\n`);
} else {
  const lines = [
    `pdctl transfer benchmark — ${ROUNDS_BYTES / 2 ** 20} MiB per measurement, CRC32C ${result.backends.crc32cHardware ? 'in hardware' : 'in software'}`,
    '',
    '| page size | layout | threads | transfer GB/s | memcpy GB/s | ratio |',
    '|---:|---|---:|---:|---:|---:|',
    ...rows.map(
      (r) =>
        `| ${r.pageBytes >= 2 ** 20 ? `${r.pageBytes / 2 ** 20} MiB` : `${r.pageBytes / 1024} KiB`} | ${r.layout} | ${r.threads} | ${r.gbPerSec} | ${r.memcpyGbPerSec} | ${r.ratio.toFixed(2)} |`,
    ),
    '',
    `single 64 KiB page, post → completion: p50 ${latency.p50Micros} µs, p99 ${latency.p99Micros} µs (${latency.transfers} transfers)`,
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}
