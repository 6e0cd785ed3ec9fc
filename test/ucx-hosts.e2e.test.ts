/**
 * KV across hosts, the transfer alone: this process sends pages over UCX's TCP transport into
 * the receives a node on test host b posted in its pool (src/drills/hosts.ts: its own network and
 * /dev/shm), which checks the CRC32C of what arrived. A partition of the link mid-transfer ends the transfer within its
 * deadline; healed, the next one goes through.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { TestHosts, testHostsUnavailable } from '../src/drills/hosts.ts';
import { KvPool } from '../src/transfer/pool.ts';
import { UcxNode, type UcxPoolDescriptor, ucxBackend } from '../src/transfer/ucx.ts';
import { firstLine, peerLines, spawnUcxPeer } from './helpers/ucx-peer.ts';

process.env.UCX_TLS ??= 'tcp';
const why = testHostsUnavailable() ?? (ucxBackend().available ? null : ucxBackend().reason);

let hosts: TestHosts | null = null;
const cleanups: Array<() => unknown> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  hosts?.destroy();
  hosts = null;
});

describe.skipIf(why !== null)(`UCX between test hosts${why ? ` (skipped: ${why})` : ''}`, () => {
  it('moves pages to another host, verified there; a partition ends a transfer in time; healed, it works', async () => {
    hosts = await TestHosts.create({ names: ['a', 'b'], reach: ['b'] });
    const peer = spawnUcxPeer(hosts, 'b', 'self', 64, 65536);
    const lines = peerLines(peer);
    const next = lines.next;
    const ask = async (cmd: string) => {
      peer.stdin?.write(`${cmd}\n`);
      return next();
    };
    cleanups.push(() => peer.stdin?.write('exit\n'));
    const first = await firstLine(peer, lines);
    const desc = JSON.parse(first) as Record<string, string | number>;
    const dst: UcxPoolDescriptor = {
      address: Buffer.from(desc.address as string, 'base64'),
      pageBytes: desc.pageBytes as number,
      pages: desc.pages as number,
      epoch: desc.epoch as number,
    };
    // Host b's pool is in b's /dev/shm alone.
    expect(await ask('ls')).toContain((desc.pool as string).slice(1));
    const src = KvPool.create({
      name: `/pdctl-ucx-src-${process.pid}`,
      pages: 64,
      pageBytes: 65536,
    });
    cleanups.push(() => {
      src.close();
      KvPool.unlink(src.name);
    });
    for (let i = 0; i < 64; i++) src.page(i).fill(i * 7 + 1);
    process.env.UCX_NET_DEVICES = hosts.device('self', 'b');
    const sender = UcxNode.open();
    delete process.env.UCX_NET_DEVICES;
    cleanups.push(() => sender.close());
    /** Host b posts the room's receive into `to`; this process sends `from` there. */
    const move = async (room: string, from: number[], to: number[], deadlineMs: number) => {
      expect(await ask(`recv ${room} ${to.join(',')}`)).toBe(`posted ${room}`);
      return sender.post({ room, src, pages: from, dst, deadlineMs });
    };
    const from = Array.from({ length: 48 }, (_, i) => i);
    const to = from.map((i) => 63 - i);
    const r = await move('room-hosts', from, to, 10_000);
    expect(r.status, r.error ?? '').toBe('ok');
    expect(r.bytes).toBe(48 * 65536);
    expect(await next()).toBe('received room-hosts ok');
    expect(await ask(`checksum ${to.join(',')}`)).toBe(`checksum ${r.checksum}`);

    // Cut this process off from b: the transfer ends within its deadline, never hangs; b's
    // receive stays posted until it is cancelled.
    await hosts.setReach('b', false);
    const cutAt = Date.now();
    const cut = await move('room-cut', from, to, 1500);
    expect(['stalled', 'failed']).toContain(cut.status);
    expect(Date.now() - cutAt).toBeLessThan(8000);
    expect(await ask('cancel room-cut')).toBe('cancelled room-cut 1');
    expect(await next()).toBe('received room-cut cancelled');
    await hosts.setReach('b', true);
    let healed = await move('room-healed', [5], [5], 10_000);
    // The endpoint the cut broke is dropped; the next transfer makes a new one.
    if (healed.status !== 'ok') {
      expect(await ask('cancel room-healed')).toBe('cancelled room-healed 1');
      expect(await next()).toBe('received room-healed cancelled');
      healed = await move('room-healed-2', [5], [5], 10_000);
    }
    expect(healed.status, healed.error ?? '').toBe('ok');
    expect(await next()).toMatch(/^received room-healed(-2)? ok$/);
    expect(await ask('checksum 5')).toBe(`checksum ${healed.checksum}`);

    // Cut again under a live endpoint: the message cannot finish, and a cancel ends the send
    // `cancelled` promptly instead of at its (far) deadline.
    await hosts.setReach('b', false);
    const pending = move('room-cancel', from, to, 60_000);
    await new Promise((r) => setTimeout(r, 100));
    const cancelAt = Date.now();
    expect(sender.cancel('room-cancel')).toBe(1);
    const cancelled = await pending;
    expect(cancelled.status, cancelled.error ?? '').toBe('cancelled');
    expect(Date.now() - cancelAt).toBeLessThan(5000);
  }, 60_000);
});
