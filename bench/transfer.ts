/**
 * Transfer-core benchmark: GB/s of the transfer core for 4 KiB, 64 KiB and 1 MiB pages, contiguous
 * and scattered page lists, 1 and 2 worker threads, against a bare memcpy of the same bytes
 * measured by the addon in the same run; and p50/p99 completion latency of a single-page transfer.
 * Where the addon finds CUDA and a device, the same for host→device, device→device and
 * device→host transfers against a bare cudaMemcpy (scripts/gpu-check.sh runs it so).
 *
 *   npm run bench:transfer                      # a table
 *   npm run bench:transfer -- --json            # one JSON object with stable keys
 *   npm run bench:transfer -- --transport ucx   # UCX between two test hosts (transfer-ucx.ts)
 */
import { NativeTransferCore } from '../src/transfer/core.ts';
import { native } from '../src/transfer/native.ts';
import { KvPool } from '../src/transfer/pool.ts';
import { asJson, checkFlags, flag, say as log, percentile } from './args.ts';
import { ucxBenchmark } from './transfer-ucx.ts';

const transport = flag('--transport', 'shm');
checkFlags();
if (transport === 'ucx') {
  await ucxBenchmark();
  process.exit(0);
}
if (transport !== 'shm') {
  process.stderr.write(`--transport must be shm (the default) or ucx, got ${transport}\n`);
  process.exit(2);
}

const TOTAL_BYTES = 64 * 2 ** 20; // per pool
const ROUNDS_BYTES = 1024 * 2 ** 20; // bytes moved per measurement
const names: string[] = [];
/** A 64 MiB pool of `pageBytes` pages, in host shared memory or on CUDA `device`. */
const pool = (pageBytes: number, device?: number) => {
  const name = `/pdctl-bench-${process.pid}-${names.length}`;
  names.push(name);
  return KvPool.create({
    name,
    pages: TOTAL_BYTES / pageBytes,
    pageBytes,
    ...(device === undefined ? {} : { device }),
  });
};
process.on('exit', () => {
  for (const n of names) KvPool.unlink(n);
});

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
  const memcpyGbPerSec = baseline(src, dst);
  for (const layout of ['contiguous', 'scattered'] as const) {
    for (const threads of [1, 2]) {
      log(`transfer: ${pageBytes} B pages, ${layout}, ${threads} thread(s)`);
      const gbPerSec = await throughput(src, dst, layout, threads);
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

/** GB/s of a bare copy of every byte of src into dst by the addon (memcpy, or cudaMemcpy). */
function baseline(src: KvPool, dst: KvPool): number {
  const bytes = src.pages * src.pageBytes;
  const rounds = ROUNDS_BYTES / bytes;
  native().memcpyNanos(src.handleForTransfer(), dst.handleForTransfer(), bytes, 1); // warm the pages
  return (
    ROUNDS_BYTES /
    native().memcpyNanos(src.handleForTransfer(), dst.handleForTransfer(), bytes, rounds)
  );
}

/** GB/s of the transfer core moving ROUNDS_BYTES from src into dst, as 16 transfers per pass. */
async function throughput(
  src: KvPool,
  dst: KvPool,
  layout: 'contiguous' | 'scattered',
  threads: number,
): Promise<number> {
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
  const rounds = ROUNDS_BYTES / (src.pages * src.pageBytes);
  const core = new NativeTransferCore({ threads });
  const t0 = process.hrtime.bigint();
  for (let round = 0; round < rounds; round++) {
    await Promise.all(
      Array.from({ length: 16 }, (_, k) => {
        const pairs = Array.from(
          { length: perTransfer },
          (_, i) => [k * perTransfer + i, order[k * perTransfer + i] as number] as [number, number],
        );
        return core.post({ room: `bench-${k}`, src, dst, pairs, deadlineMs: 60_000 });
      }),
    );
  }
  const ns = Number(process.hrtime.bigint() - t0);
  await core.close();
  return ROUNDS_BYTES / ns;
}

function round2(x: number): number {
  return Math.round(x * 100) / 100;
}

/** Completion latency of one 64 KiB page, post to promise resolved, one at a time. */
async function singlePageLatency(src: KvPool, dst: KvPool, transfers: number) {
  const core = new NativeTransferCore({ threads: 1 });
  const latencies: number[] = [];
  for (let i = 0; i < transfers; i++) {
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
  return {
    transfers,
    p50Micros: round2(percentile(latencies, 50)),
    p99Micros: round2(percentile(latencies, 99)),
  };
}

log('latency: single 64 KiB page transfers');
const latency = await (async () => {
  const src = pool(65536);
  const dst = pool(65536);
  try {
    return await singlePageLatency(src, dst, 5000);
  } finally {
    src.close();
    dst.close();
  }
})();

// CUDA: each direction between host and device memory, against a synchronous cudaMemcpy of the
// same bytes between the same pools. Only where the addon finds a CUDA runtime and a device.
interface CudaRow {
  direction: 'host→device' | 'device→device' | 'device→host';
  pageBytes: number;
  layout: 'contiguous' | 'scattered';
  gbPerSec: number;
  cudaMemcpyGbPerSec: number;
  ratio: number;
}
const { cuda } = native().backends();
const cudaRows: CudaRow[] = [];
let cudaLatency: Awaited<ReturnType<typeof singlePageLatency>> | null = null;
if (cuda.available) {
  for (const pageBytes of [65536, 1 << 20]) {
    const host = pool(pageBytes);
    const dev = pool(pageBytes, 0);
    const dev2 = pool(pageBytes, 0);
    for (let i = 0; i < host.pages; i++) host.page(i).fill(i & 0xff);
    for (const [direction, src, dst] of [
      ['host→device', host, dev],
      ['device→device', dev, dev2],
      ['device→host', dev2, host],
    ] as const) {
      const cudaMemcpyGbPerSec = baseline(src, dst);
      for (const layout of ['contiguous', 'scattered'] as const) {
        log(`cuda: ${direction}, ${pageBytes} B pages, ${layout}`);
        const gbPerSec = await throughput(src, dst, layout, 2);
        cudaRows.push({
          direction,
          pageBytes,
          layout,
          gbPerSec: round2(gbPerSec),
          cudaMemcpyGbPerSec: round2(cudaMemcpyGbPerSec),
          ratio: round2(gbPerSec / cudaMemcpyGbPerSec),
        });
      }
    }
    host.close();
    dev.close();
    dev2.close();
  }
  log('cuda latency: single 64 KiB page, device → device');
  const a = pool(65536, 0);
  const b = pool(65536, 0);
  cudaLatency = await singlePageLatency(a, b, 2000);
  a.close();
  b.close();
}

const result = {
  backends: native().backends(),
  bytesPerMeasurement: ROUNDS_BYTES,
  throughput: rows,
  singlePageLatency: latency,
  // The same keys with or without CUDA: `runtime` says what was found, or why nothing was.
  cuda: {
    available: cuda.available,
    runtime: cuda.reason,
    throughput: cudaRows,
    singlePageLatency: cudaLatency,
  },
};
if (asJson) {
  process.stdout.write(`${JSON.stringify(result)}\n`);
} else {
  const size = (b: number) => (b >= 2 ** 20 ? `${b / 2 ** 20} MiB` : `${b / 1024} KiB`);
  const lines = [
    `pdctl transfer benchmark — ${ROUNDS_BYTES / 2 ** 20} MiB per measurement, CRC32C ${result.backends.crc32cHardware ? 'in hardware' : 'in software'}`,
    '',
    '| page size | layout | threads | transfer GB/s | memcpy GB/s | ratio |',
    '|---:|---|---:|---:|---:|---:|',
    ...rows.map(
      (r) =>
        `| ${size(r.pageBytes)} | ${r.layout} | ${r.threads} | ${r.gbPerSec} | ${r.memcpyGbPerSec} | ${r.ratio.toFixed(2)} |`,
    ),
    '',
    `single 64 KiB page, post → completion: p50 ${latency.p50Micros} µs, p99 ${latency.p99Micros} µs (${latency.transfers} transfers)`,
    '',
    ...(cuda.available && cudaLatency
      ? [
          `CUDA (${cuda.reason}), 2 threads`,
          '',
          '| direction | page size | layout | transfer GB/s | cudaMemcpy GB/s | ratio |',
          '|---|---:|---|---:|---:|---:|',
          ...cudaRows.map(
            (r) =>
              `| ${r.direction} | ${size(r.pageBytes)} | ${r.layout} | ${r.gbPerSec} | ${r.cudaMemcpyGbPerSec} | ${r.ratio.toFixed(2)} |`,
          ),
          '',
          `single 64 KiB page, device → device: p50 ${cudaLatency.p50Micros} µs, p99 ${cudaLatency.p99Micros} µs (${cudaLatency.transfers} transfers)`,
        ]
      : [`CUDA: skipped (${cuda.reason})`]),
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}
