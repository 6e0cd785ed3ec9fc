/**
 * The CUDA backend of the transfer core: device pools, transfers between host and device memory in
 * every direction, IPC between processes, and cancel, deadline, epoch and corruption on device
 * transfers.
 *
 * Which runtime: on CI and machines without a GPU, the stand-in runtime built beside the addon
 * (native/test/fake-cudart.cc: device memory that faults if the host touches it, streams that copy
 * on their own thread). Under `scripts/gpu-check.sh` (PDCTL_CUDA_TESTS=real), the runtime the
 * addon finds by itself (libcudart, or PDCTL_CUDART) and a real device; the checks that need the
 * stand-in's knobs are skipped there.
 */
import { readdirSync } from 'node:fs';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { firstWrongByte, patternByte } from '../../test/helpers/page-pattern.ts';
import { startPoolChild } from '../../test/helpers/pool-child-driver.ts';
import { waitFor } from '../../test/helpers/wait.ts';
import { rng } from '../journal/synth.ts';
import { NativeTransferCore, type TransferCore } from './core.ts';
import { TransferError } from './errors.ts';
import { FAKE_CUDART_PATH } from './native.ts';
import { backends, crc32c, KvPool } from './pool.ts';

const REAL = process.env.PDCTL_CUDA_TESTS === 'real';
// Read by the addon on its first use of CUDA, and inherited by the child processes.
if (!REAL) process.env.PDCTL_CUDART = FAKE_CUDART_PATH;

let n = 0;
const names: string[] = [];
const pools: KvPool[] = [];
const pool = (options: { device?: number; pages?: number; pageBytes?: number } = {}) => {
  const name = `/pdctl-cuda-${process.pid}-${n++}`;
  names.push(name);
  const p = KvPool.create({
    name,
    pages: options.pages ?? 64,
    pageBytes: options.pageBytes ?? 4096,
    ...(options.device === undefined ? {} : { device: options.device }),
  });
  pools.push(p);
  return p;
};
const cores: TransferCore[] = [];
const core = (threads = 2) => {
  const c = new NativeTransferCore({ threads });
  cores.push(c);
  return c;
};
afterEach(async () => {
  for (const c of cores.splice(0)) await c.close();
  delete process.env.FAKE_CUDA_COPY_US;
});
afterAll(() => {
  for (const p of pools) p.close();
  for (const name of names) KvPool.unlink(name);
});

/** Every page written with the pattern, through write() so that it works for any pool. */
const fill = (p: KvPool) => {
  for (let i = 0; i < p.pages; i++) {
    const page = new Uint8Array(p.pageBytes);
    for (let j = 0; j < page.length; j++) page[j] = patternByte(i, j);
    p.write(i, page);
  }
};

/** The stand-in runtime's allocations of this process still alive (one shm object each). */
const fakeAllocations = () =>
  readdirSync('/dev/shm').filter((f) => f.startsWith(`pdctl-fakecuda-${process.pid}-`));

describe('the CUDA backend', () => {
  it('is found, and says which runtime and how many devices', () => {
    const { cuda } = backends();
    expect(cuda.available, cuda.reason).toBe(true);
    expect(cuda.devices).toBeGreaterThanOrEqual(1);
    expect(cuda.reason).toMatch(/: \d+ device\(s\)$/);
    if (!REAL) expect(cuda.reason).toContain('pdctl_fake_cudart');
  });

  it('keeps a device pool in device memory: read and write only, checksums as on the host', () => {
    const p = pool({ device: 0, pages: 8, pageBytes: 4096 });
    expect(p.device).toBe(0);
    expect(() => p.page(0)).toThrow(/GPU memory|CUDA device 0/);
    const data = new Uint8Array(3 * 4096 + 100);
    for (let j = 0; j < data.length; j++) data[j] = (j * 11) & 0xff;
    p.write(2, data);
    const back = p.read(2, 4);
    expect(Buffer.compare(back.subarray(0, data.length), data)).toBe(0);
    expect(p.checksum(2, 3)).toBe(crc32c(data.subarray(0, 3 * 4096)));
    expect(p.checksumPages([3, 2])).toBe(
      crc32c(Buffer.concat([data.subarray(4096, 8192), data.subarray(0, 4096)])),
    );
    // Opened again in this process: the same device memory, not a second mapping of it.
    const again = KvPool.open(p.name);
    pools.push(again);
    expect([again.device, again.epoch]).toEqual([0, p.epoch]);
    expect(Buffer.compare(again.read(2), data.subarray(0, 4096))).toBe(0);
  });

  it('refuses a device that does not exist, with a coded error and the count it sees', () => {
    const devices = backends().cuda.devices;
    let err: unknown;
    try {
      pool({ device: devices });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TransferError);
    expect((err as TransferError).code).toBe('TRANSFER_BACKEND_UNAVAILABLE');
    expect((err as TransferError).message).toContain(`sees ${devices}`);
  });

  it('moves pages host to device, device to device and device to host, scattered and contiguous', async () => {
    const c = core();
    const host = pool();
    fill(host);
    const d1 = pool({ device: 0 });
    const d2 = pool({ device: 0 });
    const back = pool();
    // Contiguous runs on both sides (0..9 → 20..29), then scattered pages.
    const pairs: Array<[number, number]> = [
      ...Array.from({ length: 10 }, (_, i) => [i, 20 + i] as [number, number]),
      [40, 3],
      [12, 63],
      [7, 50],
    ];
    const expected = host.checksumPages(pairs.map(([s]) => s));
    let pages = pairs;
    for (const [src, dst] of [
      [host, d1],
      [d1, d2],
      [d2, back],
    ] as const) {
      const r = await c.post({
        room: `room-${src.name.slice(1)}`,
        src,
        dst,
        pairs: pages,
        deadlineMs: 10_000,
      });
      expect(r, `${src.device ?? 'host'} → ${dst.device ?? 'host'}`).toMatchObject({
        status: 'ok',
        bytes: pairs.length * 4096,
        checksum: expected,
        error: null,
      });
      expect(dst.checksumPages(pages.map(([, d]) => d))).toBe(r.checksum);
      // The next hop reads what this one wrote.
      pages = pages.map(([, d]) => [d, d] as [number, number]);
    }
    for (const [s, d] of pairs) expect(firstWrongByte(back.page(d), s), `page ${s}`).toBe(-1);
  });

  it('lets the destination detect injected corruption of device memory', async () => {
    const c = core();
    const src = pool({ device: 0 });
    const dst = pool({ device: 0 });
    fill(src);
    c.inject({ room: 'room-corrupt', kind: 'corrupt' });
    const r = await c.post({ room: 'room-corrupt', src, dst, pairs: [[5, 6]], deadlineMs: 5000 });
    expect(r.status).toBe('ok');
    expect(r.checksum).toBe(src.checksum(5));
    expect(dst.checksumPages([6])).not.toBe(r.checksum);
  });

  it('refuses to write a device pool that was re-created', async () => {
    const c = core();
    const src = pool({ device: 0 });
    const dst = pool({ device: 0 });
    const epoch = dst.epoch;
    const recreated = KvPool.create({
      name: dst.name,
      pages: 64,
      pageBytes: 4096,
      device: 0,
      replace: true,
    });
    pools.push(recreated);
    expect(recreated.epoch).not.toBe(epoch);
    const r = await c.post({
      room: 'room-epoch',
      src,
      dst: recreated,
      pairs: [[0, 0]],
      deadlineMs: 5000,
      epoch,
    });
    expect(r.status).toBe('epoch_mismatch');
    const old = await c.post({
      room: 'room-epoch-old',
      src,
      dst,
      pairs: [[0, 0]],
      deadlineMs: 5000,
    });
    expect(old.status).toBe('epoch_mismatch');
  });

  it.skipIf(REAL)(
    'stops a device transfer between windows on cancel and on its deadline, and writes nothing after',
    async () => {
      // Each queued copy takes 5 ms on the stand-in's stream: a window of 64 scattered pages 320 ms.
      process.env.FAKE_CUDA_COPY_US = '5000';
      const c = core(1);
      const src = pool({ device: 0, pages: 256 });
      const dst = pool({ device: 0, pages: 256 });
      fill(src);
      // Destination pages in reverse order: no two copies merge.
      const pairs = Array.from({ length: 256 }, (_, i) => [i, 255 - i] as [number, number]);
      const cancelled = c.post({ room: 'room-cancel', src, dst, pairs, deadlineMs: 60_000 });
      const released = c.release('room-cancel');
      // Cancel inside the first window: it is queued as soon as the worker takes the job.
      await waitFor('the transfer running', () => c.stats().running === 1, 5000, 1);
      await new Promise((r) => setTimeout(r, 100));
      expect(c.cancel('room-cancel')).toBe(1);
      const r = await cancelled;
      await released;
      // The window in flight when cancel came was finished, and nothing after it was queued.
      expect(r).toMatchObject({ status: 'cancelled', bytes: 64 * 4096 });
      const written = (d: number) => firstWrongByte(dst.read(d), 255 - d) === -1;
      // Nothing lands later either: a check over time, so it waits out more than a window.
      await new Promise((r) => setTimeout(r, 400));
      expect(pairs.filter(([, d]) => written(d)).length).toBe(64);

      const stalled = await c.post({ room: 'room-deadline', src, dst, pairs, deadlineMs: 100 });
      expect(stalled).toMatchObject({ status: 'stalled', bytes: 64 * 4096 });
      expect(stalled.micros).toBeGreaterThanOrEqual(300_000);
    },
  );

  it('completes 2,000 concurrent device transfers with random cancels, and leaks nothing', async () => {
    const before = fakeAllocations().length;
    const c = core();
    const host = pool({ pages: 256, pageBytes: 256 });
    const dev = pool({ device: 0, pages: 256, pageBytes: 256 });
    const rand = rng(11);
    const posts = Array.from({ length: 2000 }, (_, i) =>
      c.post({
        room: `r-${i % 100}`,
        src: i % 2 ? host : dev,
        dst: i % 2 ? dev : host,
        pairs: [[i % 256, (i * 7) % 256]],
        deadlineMs: 60_000,
      }),
    );
    for (let k = 0; k < 50; k++) c.cancel(`r-${Math.floor(rand() * 100)}`);
    const results = await Promise.all(posts);
    const counts: Record<string, number> = {};
    for (const r of results) counts[r.status] = (counts[r.status] ?? 0) + 1;
    expect((counts.ok ?? 0) + (counts.cancelled ?? 0), JSON.stringify(counts)).toBe(2000);
    await Promise.all(Array.from({ length: 100 }, (_, i) => c.release(`r-${i}`)));
    expect(c.stats()).toMatchObject({ queued: 0, running: 0, inFlight: 0 });
    if (!REAL) {
      expect(fakeAllocations().length).toBe(before + 1);
      dev.close();
      expect(fakeAllocations().length).toBe(before);
    }
  });
});

describe('a device transfer between two processes', () => {
  it('maps the other process pool through its IPC handle and receives every byte', async () => {
    const srcName = `/pdctl-cuda-src-${process.pid}`;
    names.push(srcName);
    const child = await startPoolChild(srcName, 32, 65536, 0);
    const { written } = child;
    const src = KvPool.open(srcName);
    pools.push(src);
    expect(src.device).toBe(0);
    const dst = pool({ device: 0, pages: 64, pageBytes: 65536 });
    const pairs = Array.from({ length: 32 }, (_, i) => [i, 32 + i] as [number, number]);
    const r = await core().post({ room: 'room-ipc', src, dst, pairs, deadlineMs: 10_000 });
    expect(r).toMatchObject({ status: 'ok', bytes: 32 * 65536, checksum: written.all });
    for (let i = 0; i < 32; i++) {
      expect(firstWrongByte(dst.read(32 + i), i), `page ${i}`).toBe(-1);
    }
    expect(dst.checksumPages(pairs.map(([, d]) => d))).toBe(written.all);
    src.close();
    expect(await child.finish()).toBe(0);
  });
});
