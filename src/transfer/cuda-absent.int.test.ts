/**
 * Without CUDA (what CI has): the addon loads and runs, `backends()` says why there is no CUDA,
 * and a device pool fails with a coded error that names the cause, taking nothing with it.
 * PDCTL_CUDART names a library that does not exist, so the answer is the same on any machine.
 */
import { describe, expect, it } from 'vitest';
import { NativeTransferCore } from './core.ts';
import { TransferError } from './errors.ts';
import { backends, KvPool } from './pool.ts';

process.env.PDCTL_CUDART = `/nonexistent/libcudart-${process.pid}.so`;

describe('without a CUDA runtime', () => {
  it('reports CUDA absent, refuses device pools, and still serves host pools', async () => {
    const { cuda, shm } = backends();
    expect(shm).toBe(true);
    expect(cuda).toMatchObject({ available: false, devices: 0 });
    expect(cuda.reason).toContain('PDCTL_CUDART=/nonexistent/');

    const name = `/pdctl-nocuda-${process.pid}`;
    let err: unknown;
    try {
      KvPool.create({ name, pages: 4, pageBytes: 4096, device: 0 });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(TransferError);
    expect((err as TransferError).code).toBe('TRANSFER_BACKEND_UNAVAILABLE');
    expect((err as TransferError).message).toContain('CUDA is not available');
    // The failed device pool did not take the name.
    expect(KvPool.unlink(name)).toBe(false);

    const src = KvPool.create({ name: `${name}-src`, pages: 4, pageBytes: 4096 });
    const dst = KvPool.create({ name: `${name}-dst`, pages: 4, pageBytes: 4096 });
    const core = new NativeTransferCore({ threads: 1 });
    try {
      src.page(1).fill(7);
      const r = await core.post({ room: 'room-host', src, dst, pairs: [[1, 2]], deadlineMs: 5000 });
      expect(r.status).toBe('ok');
      expect(dst.page(2)[4095]).toBe(7);
    } finally {
      await core.close();
      src.close();
      dst.close();
      KvPool.unlink(src.name);
      KvPool.unlink(dst.name);
    }
  });
});
