import { afterEach, describe, expect, it } from 'vitest';
import { firstWrongByte } from '../../test/helpers/page-pattern.ts';
import { startPoolChild } from '../../test/helpers/pool-child-driver.ts';
import { testPools } from '../../test/helpers/pools.ts';
import { waitFor } from '../../test/helpers/wait.ts';
import { rng } from '../journal/synth.ts';
import { NativeTransferCore, type TransferCore } from './core.ts';
import { TransferError } from './errors.ts';
import { KvPool } from './pool.ts';

const { pool, names } = testPools('xfer');
const cores: TransferCore[] = [];
const core = (threads = 2) => {
  const c = new NativeTransferCore({ threads });
  cores.push(c);
  return c;
};
afterEach(async () => {
  for (const c of cores.splice(0)) await c.close();
});

const fill = (p: KvPool) => {
  for (let i = 0; i < p.pages; i++) {
    const page = p.page(i);
    for (let j = 0; j < page.length; j++) page[j] = (i * 13 + j) & 0xff;
  }
};

describe('NativeTransferCore', () => {
  it('copies scattered and contiguous pages, and the destination verifies the checksum', async () => {
    const src = pool();
    const dst = pool();
    fill(src);
    const pairs: Array<[number, number]> = [
      [0, 10],
      [1, 11],
      [2, 12],
      [7, 3],
      [40, 63],
    ];
    const r = await core().post({ room: 'room-ok', src, dst, pairs, deadlineMs: 5000 });
    expect(r).toMatchObject({ room: 'room-ok', status: 'ok', bytes: 5 * 4096, error: null });
    for (const [s, d] of pairs) expect(Buffer.compare(src.page(s), dst.page(d))).toBe(0);
    expect(dst.checksumPages(pairs.map(([, d]) => d))).toBe(r.checksum);
  });

  it('cancels a running transfer between chunks, and release() waits for it', async () => {
    const c = core();
    const src = pool();
    const dst = pool();
    c.inject({ room: 'room-cancel', kind: 'delay', ms: 5000 });
    const order: string[] = [];
    const done = c
      .post({ room: 'room-cancel', src, dst, pairs: [[0, 0]], deadlineMs: 10_000 })
      .then((r) => {
        order.push('completed');
        return r;
      });
    const released = c.release('room-cancel').then(() => order.push('released'));
    await waitFor('the transfer running', () => c.stats().running === 1, 5000, 1);
    expect(c.cancel('room-cancel')).toBe(1);
    expect((await done).status).toBe('cancelled');
    await released;
    expect(order).toEqual(['completed', 'released']);
  });

  it('ends a transfer that overruns its deadline as stalled', async () => {
    const c = core();
    c.inject({ room: 'room-stall', kind: 'stall' });
    const r = await c.post({
      room: 'room-stall',
      src: pool(),
      dst: pool(),
      pairs: [[0, 0]],
      deadlineMs: 50,
    });
    expect(r.status).toBe('stalled');
    expect(r.micros).toBeGreaterThanOrEqual(50_000);
  });

  it('refuses to write a destination that was re-created, at post and during the copy', async () => {
    const c = core();
    const src = pool();
    const dst = pool();
    const epoch = dst.epoch;
    c.inject({ room: 'room-epoch-late', kind: 'delay', ms: 5000 });
    const late = c.post({ room: 'room-epoch-late', src, dst, pairs: [[0, 0]], deadlineMs: 5000 });
    await waitFor('the transfer running', () => c.stats().running === 1, 5000, 1);
    const recreated = KvPool.create({ name: dst.name, pages: 64, pageBytes: 4096, replace: true });
    expect(recreated.epoch).not.toBe(epoch);
    expect((await late).status).toBe('epoch_mismatch');
    const atPost = await c.post({
      room: 'room-epoch',
      src,
      dst,
      pairs: [[0, 0]],
      deadlineMs: 5000,
    });
    expect(atPost.status).toBe('epoch_mismatch');
    const stale = await c.post({
      room: 'room-epoch-2',
      src,
      dst: recreated,
      pairs: [[0, 0]],
      deadlineMs: 5000,
      epoch,
    });
    expect(stale.status).toBe('epoch_mismatch');
    recreated.close();
  });

  it('lets the destination detect injected corruption', async () => {
    const c = core();
    const src = pool();
    const dst = pool();
    fill(src);
    c.inject({ room: 'room-corrupt', kind: 'corrupt' });
    const r = await c.post({ room: 'room-corrupt', src, dst, pairs: [[5, 6]], deadlineMs: 5000 });
    expect(r.status).toBe('ok');
    expect(dst.checksumPages([6])).not.toBe(r.checksum);
    c.clearFaults();
    const clean = await c.post({ room: 'room-clean', src, dst, pairs: [[5, 6]], deadlineMs: 5000 });
    expect(dst.checksumPages([6])).toBe(clean.checksum);
  });

  it('completes 10,000 concurrent small transfers with random cancels, and leaks nothing', async () => {
    const c = core();
    const src = pool(256, 256);
    const dst = pool(256, 256);
    const rand = rng(7);
    const posts = Array.from({ length: 10_000 }, (_, i) =>
      c.post({
        room: `r-${i % 500}`,
        src,
        dst,
        pairs: [[i % 256, (i * 7) % 256]],
        deadlineMs: 60_000,
      }),
    );
    for (let k = 0; k < 200; k++) c.cancel(`r-${Math.floor(rand() * 500)}`);
    const results = await Promise.all(posts);
    const counts: Record<string, number> = {};
    for (const r of results) counts[r.status] = (counts[r.status] ?? 0) + 1;
    expect((counts.ok ?? 0) + (counts.cancelled ?? 0)).toBe(10_000);
    await Promise.all(Array.from({ length: 500 }, (_, i) => c.release(`r-${i}`)));
    expect(c.stats()).toMatchObject({ queued: 0, running: 0, inFlight: 0 });
  });

  it('rejects bad arguments with coded errors', async () => {
    const c = core();
    const src = pool();
    const dst = pool();
    const small = pool(4, 64);
    const cases: Array<[Parameters<TransferCore['post']>[0], string]> = [
      [{ room: 'bad room', src, dst, pairs: [[0, 0]], deadlineMs: 10 }, 'TRANSFER_BAD_ARGUMENT'],
      [{ room: 'r', src, dst, pairs: [], deadlineMs: 10 }, 'TRANSFER_BAD_ARGUMENT'],
      [{ room: 'r', src, dst, pairs: [[64, 0]], deadlineMs: 10 }, 'TRANSFER_BAD_ARGUMENT'],
      [
        {
          room: 'r',
          src,
          dst,
          pairs: [
            [0, 1],
            [1, 1],
          ],
          deadlineMs: 10,
        },
        'TRANSFER_BAD_ARGUMENT',
      ],
      [{ room: 'r', src, dst, pairs: [[0, 0]], deadlineMs: 0 }, 'TRANSFER_BAD_ARGUMENT'],
      [{ room: 'r', src, dst: small, pairs: [[0, 0]], deadlineMs: 10 }, 'TRANSFER_BAD_ARGUMENT'],
      [
        { room: 'r', src, dst, pairs: [['a', 0] as unknown as [number, number]], deadlineMs: 10 },
        'TRANSFER_BAD_ARGUMENT',
      ],
    ];
    for (const [request, code] of cases) {
      const err = await c.post(request).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(TransferError);
      expect((err as TransferError).code).toBe(code);
    }
    small.close();
    await expect(
      c.post({ room: 'r', src: small, dst, pairs: [[0, 0]], deadlineMs: 10 }),
    ).rejects.toMatchObject({ code: 'TRANSFER_POOL_CLOSED' });
    expect(() => c.inject({ kind: 'explode' as never })).toThrow(TransferError);
    await c.close();
    await expect(
      c.post({ room: 'r', src, dst, pairs: [[0, 0]], deadlineMs: 10 }),
    ).rejects.toMatchObject({ code: 'TRANSFER_WORKERS_CLOSED' });
  });
});

describe('a transfer between two processes', () => {
  it('receives every byte another process wrote, and the checksum matches at both ends', async () => {
    const srcName = `/pdctl-xfer-src-${process.pid}`;
    names.push(srcName);
    const child = await startPoolChild(srcName, 32, 65536);
    const { written } = child;
    const src = KvPool.open(srcName);
    const dst = pool(64, 65536);
    try {
      // Pages 0..31 in order into 32..63: one contiguous run of 2 MiB.
      const pairs = Array.from({ length: 32 }, (_, i) => [i, 32 + i] as [number, number]);
      const r = await core().post({
        room: 'room-two-processes',
        src,
        dst,
        pairs,
        deadlineMs: 10_000,
      });
      expect(r).toMatchObject({ status: 'ok', bytes: 32 * 65536 });
      expect(r.checksum).toBe(written.all);
      for (let i = 0; i < 32; i++) {
        expect(firstWrongByte(dst.page(32 + i), i), `page ${i}`).toBe(-1);
      }
      expect(dst.checksumPages(pairs.map(([, d]) => d))).toBe(r.checksum);
    } finally {
      src.close();
      dst.close();
    }
    expect(await child.finish()).toBe(0);
  });
});
