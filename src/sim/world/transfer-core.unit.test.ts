/**
 * The simulator's transfer core on a virtual clock: pages land when the transfer completes, the
 * checksum is the source's, and the drills' faults end transfers as the native core's do.
 */
import { describe, expect, it } from 'vitest';
import { VirtualClock } from './clock.ts';
import { MemoryPools } from './pools.ts';
import { MemoryTransferCore } from './transfer-core.ts';

function rig() {
  const clock = new VirtualClock(0);
  const pools = new MemoryPools();
  const src = pools.create('/p0', 8, 64);
  const dst = pools.create('/d0', 8, 64);
  for (let p = 0; p < 8; p++) src.page(p).fill(p + 1);
  const core = new MemoryTransferCore(clock, { latencyMs: 2 });
  const post = (room: string, deadlineMs = 100) =>
    core.post({
      room,
      src,
      dst,
      pairs: [
        [1, 5],
        [2, 6],
      ],
      deadlineMs,
    });
  return { clock, pools, src, dst, core, post };
}

describe('MemoryTransferCore', () => {
  it('moves the pages when the transfer completes, with the source checksum', async () => {
    const { clock, src, dst, post } = rig();
    const done = post('r-1');
    await clock.run(1);
    expect(dst.page(5)[0]).toBe(0);
    await clock.run(5);
    const r = await done;
    expect(r).toMatchObject({ room: 'r-1', status: 'ok', bytes: 128, error: null });
    expect(r.checksum).toBe(src.checksumPages([1, 2]));
    expect(dst.checksumPages([5, 6])).toBe(r.checksum);
  });

  it('ends transfers as the faults say: corrupt, stall, fail; a cancel ends one and releases its room', async () => {
    const { clock, dst, core, post } = rig();
    core.inject({ kind: 'corrupt' });
    const corrupt = post('r-1');
    await clock.run(5);
    const c = await corrupt;
    expect(c.status).toBe('ok');
    expect(dst.checksumPages([5, 6])).not.toBe(c.checksum);
    core.inject({ kind: 'stall' });
    const stalled = post('r-2', 50);
    await clock.run(49);
    expect(core.stats().inFlight).toBe(1);
    await clock.run(1);
    expect((await stalled).status).toBe('stalled');
    core.clearFaults();
    core.inject({ kind: 'fail', room: 'r-3' });
    const failed = post('r-3');
    const cancelled = post('r-4');
    const released = core.release('r-4');
    expect(core.cancel('r-4')).toBe(1);
    await released;
    expect((await cancelled).status).toBe('cancelled');
    await clock.run(5);
    expect((await failed).status).toBe('failed');
  });

  it('refuses a destination pool created again since the transfer was prepared', async () => {
    const { clock, pools, post } = rig();
    pools.create('/d0', 8, 64);
    const r = post('r-1');
    await clock.run(1);
    expect((await r).status).toBe('epoch_mismatch');
  });
});
