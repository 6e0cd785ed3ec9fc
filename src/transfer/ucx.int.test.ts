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

/** Sends `pairs` (source page, destination page) as the room's message, the receive posted first. */
async function move(
  sender: UcxNode,
  receiver: UcxNode,
  room: string,
  src: KvPool,
  dst: KvPool,
  pairs: ReadonlyArray<readonly [number, number]>,
  deadlineMs = 5000,
) {
  const received = receiver.receive({ room, pool: dst, pages: pairs.map(([, d]) => d) });
  const sent = await sender.post({
    room,
    src,
    pages: pairs.map(([s]) => s),
    dst: receiver.describe(dst),
    deadlineMs,
  });
  return { sent, received: await received };
}

const untouched = (p: KvPool, page: number) => p.page(page).every((b) => b === 0);

describe.skipIf(!backend.available)('UCX backend', () => {
  it('sends scattered and contiguous pages into the pages the receiver posted; the CRC32C of what landed is the sender’s', async () => {
    const src = pool();
    const dst = pool();
    fill(src, 7);
    const sender = node();
    const receiver = node();
    const where = receiver.describe(dst);
    expect(where).toEqual({
      address: receiver.address,
      pageBytes: 4096,
      pages: 64,
      epoch: dst.epoch,
    });
    const pairs: Array<[number, number]> = [
      [0, 10],
      [1, 11],
      [2, 12],
      [7, 3],
      [40, 63],
    ];
    const { sent, received } = await move(sender, receiver, 'room-ucx', src, dst, pairs);
    expect(sent).toMatchObject({ room: 'room-ucx', status: 'ok', bytes: 5 * 4096, error: null });
    expect(received).toMatchObject({ status: 'ok', bytes: 5 * 4096 });
    for (const [s, d] of pairs) expect(Buffer.compare(src.page(s), dst.page(d))).toBe(0);
    expect(dst.checksumPages(pairs.map(([, d]) => d))).toBe(sent.checksum);
    // Only those pages were written.
    for (const page of [0, 9, 13, 62]) expect(untouched(dst, page)).toBe(true);
    // 1 MiB pages, many of them, in one message (a run of pages is one piece of it).
    const big = pool(32, 1 << 20);
    const bigDst = pool(32, 1 << 20);
    fill(big, 3);
    const run = Array.from({ length: 32 }, (_, i) => [i, 31 - i] as [number, number]);
    const moved = await move(sender, receiver, 'room-big', big, bigDst, run, 20_000);
    expect(moved.sent.status).toBe('ok');
    expect(moved.received.status).toBe('ok');
    expect(bigDst.checksumPages(run.map(([, d]) => d))).toBe(moved.sent.checksum);
  });

  it('a message sent before its receive was posted waits for it, then lands', async () => {
    const src = pool();
    const dst = pool();
    fill(src, 5);
    const sender = node();
    const receiver = node();
    const sent = sender.post({
      room: 'room-early',
      src,
      pages: [4, 5],
      dst: receiver.describe(dst),
      deadlineMs: 5000,
    });
    await new Promise((r) => setTimeout(r, 200));
    const received = await receiver.receive({ room: 'room-early', pool: dst, pages: [20, 30] });
    expect(received.status, received.error ?? '').toBe('ok');
    expect(dst.checksumPages([20, 30])).toBe((await sent).checksum);
    expect(Buffer.compare(src.page(5), dst.page(30))).toBe(0);
  });

  it('the receiver decides where bytes land: a longer, shorter or other room’s message writes nothing else', async () => {
    const src = pool();
    const dst = pool();
    fill(src, 9);
    const sender = node();
    const receiver = node();
    const where = receiver.describe(dst);
    // Longer than the pages posted: UCX truncates it, the receive fails, the next page is clean.
    const long = receiver.receive({ room: 'room-long', pool: dst, pages: [8] });
    await sender.post({ room: 'room-long', src, pages: [0, 1], dst: where, deadlineMs: 3000 });
    const truncated = await long;
    expect(truncated.status).toBe('failed');
    expect(truncated.error).toMatch(/longer than the 4096 bytes/);
    expect(untouched(dst, 9)).toBe(true);
    // Shorter: it fails too (the room's KV is not all there).
    const short = receiver.receive({ room: 'room-short', pool: dst, pages: [16, 17] });
    await sender.post({ room: 'room-short', src, pages: [2], dst: where, deadlineMs: 3000 });
    expect((await short).error).toMatch(/received 4096 bytes, the room's pages hold 8192/);
    // Another room's tag (or another pool epoch's) matches no receive: the send stalls unmatched,
    // the posted receive stays empty until cancelled.
    const waiting = receiver.receive({ room: 'room-mine', pool: dst, pages: [40] });
    const stray = await sender.post({
      room: 'room-other',
      src,
      pages: [3],
      dst: where,
      deadlineMs: 400,
    });
    expect(stray.status).toBe('stalled');
    const staleEpoch = await sender.post({
      room: 'room-mine',
      src,
      pages: [3],
      dst: { ...where, epoch: where.epoch + 1 },
      deadlineMs: 400,
    });
    expect(staleEpoch.status).toBe('stalled');
    expect(receiver.cancel('room-mine')).toBe(1);
    expect((await waiting).status).toBe('cancelled');
    await receiver.release('room-mine');
    expect(untouched(dst, 40)).toBe(true);
  });

  it('faults for drills: stall ends stalled at the deadline, fail fails, corrupt is caught by the CRC', async () => {
    const src = pool();
    const dst = pool();
    fill(src, 1);
    const sender = node();
    const receiver = node();
    const where = receiver.describe(dst);
    const post = (room: string, deadlineMs = 5000) =>
      sender.post({ room, src, pages: [0], dst: where, deadlineMs });
    sender.inject({ room: 'room-stall', kind: 'stall' });
    const started = Date.now();
    const stalled = await post('room-stall', 300);
    expect(stalled.status).toBe('stalled');
    expect(Date.now() - started).toBeGreaterThanOrEqual(290);
    sender.inject({ room: 'room-fail', kind: 'fail' });
    expect((await post('room-fail')).status).toBe('failed');
    sender.inject({ room: 'room-corrupt', kind: 'corrupt' });
    const landed = receiver.receive({ room: 'room-corrupt', pool: dst, pages: [0] });
    const corrupt = await post('room-corrupt');
    expect(corrupt.status).toBe('ok');
    expect((await landed).status).toBe('ok');
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
    const sender = node();
    const receiver = UcxNode.open();
    const where: UcxPoolDescriptor = receiver.describe(pool());
    await receiver.close();
    const started = Date.now();
    const r = await sender.post({
      room: 'room-gone',
      src,
      pages: [0],
      dst: where,
      deadlineMs: 1500,
    });
    expect(['stalled', 'failed']).toContain(r.status);
    expect(r.error).toBeTruthy();
    expect(Date.now() - started).toBeLessThan(10_000);
  });

  it('a node closed with receives posted ends them cancelled', async () => {
    const receiver = UcxNode.open();
    const dst = pool();
    const pending = receiver.receive({ room: 'room-closed', pool: dst, pages: [1, 2] });
    await receiver.close();
    expect((await pending).status).toBe('cancelled');
  });

  it('a malformed peer address is found out in a throwaway process, never in this one', async () => {
    const good = node().describe(pool());
    expect(await checkPeer(good)).toBeNull();
    // UCX aborts a process that unpacks a malformed worker address: the check's process dies.
    const garbage = await checkPeer({ address: randomBytes(64) });
    expect(garbage).toMatch(/aborted|does not unpack|cannot/);
    const truncated = await checkPeer({ address: good.address.subarray(0, 12) });
    expect(truncated).not.toBeNull();
    // And this process is still here, its node still moving pages.
    const { sent, received } = await move(node(), node(), 'room-after', pool(), pool(), [[1, 2]]);
    expect(sent.status).toBe('ok');
    expect(received.status).toBe('ok');
  });

  it('refuses bad input before anything is sent or posted', async () => {
    const sender = node();
    const src = pool();
    const receiver = node();
    const dst = pool();
    const where = receiver.describe(dst);
    const refused = { code: 'TRANSFER_BAD_ARGUMENT' };
    const post = (over: Partial<Parameters<UcxNode['post']>[0]>) =>
      sender.post({ room: 'room-bad', src, pages: [0], dst: where, deadlineMs: 1000, ...over });
    await expect(post({ pages: [64] })).rejects.toMatchObject(refused);
    await expect(post({ pages: [1, 1] })).rejects.toMatchObject(refused);
    await expect(post({ pages: [] })).rejects.toMatchObject(refused);
    await expect(post({ dst: { ...where, pageBytes: 8192 } })).rejects.toMatchObject(refused);
    await expect(post({ room: 'not a room' })).rejects.toMatchObject(refused);
    await expect(
      receiver.receive({ room: 'room-bad', pool: dst, pages: [0.5] }),
    ).rejects.toMatchObject(refused);
    await expect(
      receiver.receive({ room: 'room-bad', pool: dst, pages: [3, 3] }),
    ).rejects.toMatchObject(refused);
  });
});
