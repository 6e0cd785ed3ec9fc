/**
 * The UCX backend with the real libucp, two nodes in this process talking over UCX's TCP
 * transport (as between hosts; test/ucx-hosts.e2e.test.ts does it between test hosts). Skipped,
 * saying why, where UCX is absent — required under .ci/run (PDCTL_REQUIRE_TOOLS=ucx).
 */
import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { testPools } from '../../test/helpers/pools.ts';
import { requireTool } from '../../test/helpers/tools.ts';
import type { KvPool } from './pool.ts';
import type { UcxPoolDescriptor } from './ucx.ts';
import { checkPeer, UcxNode, ucxBackend } from './ucx.ts';

// Between hosts UCX can only use the network: make it do so here too.
process.env.UCX_TLS ??= 'tcp';

const backend = ucxBackend();
requireTool('ucx', backend.available ? backend.reason : null, backend.reason);

const { pool } = testPools('ucx');
const nodes: UcxNode[] = [];
const node = () => {
  const u = UcxNode.open();
  nodes.push(u);
  return u;
};
afterEach(async () => {
  for (const u of nodes.splice(0)) await u.close();
});

const fill = (p: KvPool, seed: number) => {
  for (let i = 0; i < p.pages; i++) {
    const page = p.page(i);
    for (let j = 0; j < page.length; j++) page[j] = (i * 31 + j + seed) & 0xff;
  }
};

describe.skipIf(!backend.available)('UCX backend', () => {
  it('puts scattered and contiguous pages into a registered pool; the receiver verifies the CRC32C', async () => {
    const src = pool();
    const dst = pool();
    fill(src, 7);
    const sender = node();
    const receiver = node();
    const where = receiver.register(dst);
    expect(where.rkey.length).toBeGreaterThan(0);
    expect(where.epoch).toBe(dst.epoch);
    const pairs: Array<[number, number]> = [
      [0, 10],
      [1, 11],
      [2, 12],
      [7, 3],
      [40, 63],
    ];
    const r = await sender.post({ room: 'room-ucx', src, dst: where, pairs, deadlineMs: 5000 });
    expect(r).toMatchObject({ room: 'room-ucx', status: 'ok', bytes: 5 * 4096, error: null });
    for (const [s, d] of pairs) expect(Buffer.compare(src.page(s), dst.page(d))).toBe(0);
    expect(dst.checksumPages(pairs.map(([, d]) => d))).toBe(r.checksum);
    // 1 MiB pages, many of them: one put per contiguous run.
    const big = pool(32, 1 << 20);
    const bigDst = pool(32, 1 << 20);
    fill(big, 3);
    const run = Array.from({ length: 32 }, (_, i) => [i, 31 - i] as [number, number]);
    const r2 = await sender.post({
      room: 'room-big',
      src: big,
      dst: receiver.register(bigDst),
      pairs: run,
      deadlineMs: 20_000,
    });
    expect(r2.status).toBe('ok');
    expect(bigDst.checksumPages(run.map(([, d]) => d))).toBe(r2.checksum);
  });

  it('faults for drills: stall ends stalled at the deadline, fail fails, corrupt is caught by the CRC', async () => {
    const src = pool();
    const dst = pool();
    fill(src, 1);
    const sender = node();
    const receiver = node();
    const where = receiver.register(dst);
    const post = (room: string, deadlineMs = 5000) =>
      sender.post({ room, src, dst: where, pairs: [[0, 0]], deadlineMs });
    sender.inject({ room: 'room-stall', kind: 'stall' });
    const started = Date.now();
    const stalled = await post('room-stall', 300);
    expect(stalled.status).toBe('stalled');
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    sender.inject({ room: 'room-fail', kind: 'fail' });
    expect((await post('room-fail')).status).toBe('failed');
    sender.inject({ room: 'room-corrupt', kind: 'corrupt' });
    const corrupt = await post('room-corrupt');
    expect(corrupt.status).toBe('ok');
    expect(dst.checksumPages([0])).not.toBe(corrupt.checksum);
    // cancel before it starts (a delay holds it): it completes cancelled, and release waits for it.
    sender.inject({ room: 'room-cancel', kind: 'delay', ms: 2000 });
    const held = post('room-cancel');
    expect(sender.cancel('room-cancel')).toBe(1);
    await sender.release('room-cancel');
    expect((await held).status).toBe('cancelled');
  });

  it('a peer that is gone ends the transfer within its deadline, never a hang', async () => {
    const src = pool();
    const dst = pool();
    const sender = node();
    const receiver = UcxNode.open();
    const where: UcxPoolDescriptor = receiver.register(dst);
    await receiver.close();
    const started = Date.now();
    const r = await sender.post({
      room: 'room-gone',
      src,
      dst: where,
      pairs: [[0, 0]],
      deadlineMs: 1500,
    });
    expect(['stalled', 'failed']).toContain(r.status);
    expect(r.error).toBeTruthy();
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it('a malformed peer descriptor is found out in a throwaway process, never in this one', async () => {
    const good = node().register(pool());
    expect(await checkPeer(good)).toBeNull();
    // UCX aborts a process that unpacks a malformed worker address: the check's process dies.
    const garbage = await checkPeer({ address: randomBytes(64), rkey: good.rkey });
    expect(garbage).toMatch(/aborted|does not unpack/);
    const truncated = await checkPeer({ address: good.address.subarray(0, 12), rkey: good.rkey });
    expect(truncated).not.toBeNull();
    // And this process is still here, its node still moving pages.
    const src = pool();
    const dst = pool();
    const r = await node().post({
      room: 'room-after',
      src,
      dst: node().register(dst),
      pairs: [[1, 2]],
      deadlineMs: 5000,
    });
    expect(r.status).toBe('ok');
  });

  it('refuses bad input before anything is sent', async () => {
    const sender = node();
    const src = pool();
    const where = node().register(pool());
    await expect(
      sender.post({ room: 'room-bad', src, dst: where, pairs: [[0, 64]], deadlineMs: 1000 }),
    ).rejects.toMatchObject({ code: 'TRANSFER_BAD_ARGUMENT' });
    await expect(
      sender.post({
        room: 'room-bad',
        src,
        dst: { ...where, pageBytes: 8192 },
        pairs: [[0, 0]],
        deadlineMs: 1000,
      }),
    ).rejects.toMatchObject({ code: 'TRANSFER_BAD_ARGUMENT' });
  });
});
