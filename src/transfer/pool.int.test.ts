import { randomBytes } from 'node:crypto';
import { afterAll, describe, expect, it } from 'vitest';
import { firstWrongByte } from '../../test/helpers/page-pattern.ts';
import { startPoolChild } from '../../test/helpers/pool-child-driver.ts';
import { TransferError } from './errors.ts';
import { native } from './native.ts';
import { backends, crc32c, KvPool } from './pool.ts';

let n = 0;
const names: string[] = [];
const uniqueName = () => {
  const name = `/pdctl-test-${process.pid}-${n++}`;
  names.push(name);
  return name;
};
afterAll(() => {
  for (const name of names) KvPool.unlink(name);
});

const codeOf = (fn: () => unknown): string | undefined => {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(TransferError);
    return (err as TransferError).code;
  }
  return undefined;
};

describe('crc32c', () => {
  it('matches the standard check value, in hardware and in software', () => {
    const check = new TextEncoder().encode('123456789');
    expect(crc32c(check)).toBe('e3069283');
    expect(crc32c(check, { software: true })).toBe('e3069283');
    const data = new Uint8Array(randomBytes(1 << 20));
    expect(crc32c(data)).toBe(crc32c(data, { software: true }));
    expect(typeof backends().crc32cHardware).toBe('boolean');
  });
});

describe('KvPool', () => {
  it('shares pages between handles without copying, and checksums page ranges', () => {
    const a = KvPool.create({ name: uniqueName(), pages: 8, pageBytes: 4096 });
    const b = KvPool.open(a.name);
    try {
      expect([b.pages, b.pageBytes, b.epoch]).toEqual([a.pages, a.pageBytes, a.epoch]);
      a.page(3).fill(0xab);
      expect(b.page(3).every((x) => x === 0xab)).toBe(true);
      expect(b.checksum(3)).toBe(crc32c(new Uint8Array(4096).fill(0xab)));
      const two = new Uint8Array(8192);
      two.set(a.page(3), 0);
      two.set(a.page(4), 4096);
      expect(a.checksum(3, 2)).toBe(crc32c(two));
    } finally {
      a.close();
      b.close();
    }
  });

  it('draws a new epoch when re-created, and refuses to re-create by accident', () => {
    const name = uniqueName();
    const first = KvPool.create({ name, pages: 2, pageBytes: 64 });
    expect(codeOf(() => KvPool.create({ name, pages: 2, pageBytes: 64 }))).toBe(
      'TRANSFER_POOL_EXISTS',
    );
    const second = KvPool.create({ name, pages: 2, pageBytes: 64, replace: true });
    expect(second.epoch).not.toBe(first.epoch);
    expect(KvPool.open(name).epoch).toBe(second.epoch);
    first.close();
    second.close();
  });

  it('copies bytes in and out with read() and write(), across page boundaries', () => {
    const pool = KvPool.create({ name: uniqueName(), pages: 4, pageBytes: 256 });
    try {
      const data = new Uint8Array(randomBytes(300));
      pool.write(1, data);
      expect(Buffer.compare(pool.page(1), data.subarray(0, 256))).toBe(0);
      expect(Buffer.compare(pool.page(2).subarray(0, 44), data.subarray(256))).toBe(0);
      const back = pool.read(1, 2);
      expect(back.length).toBe(512);
      expect(Buffer.compare(back.subarray(0, 300), data)).toBe(0);
      expect(pool.device).toBeNull();
    } finally {
      pool.close();
    }
  });

  it('keeps page views valid after close, and refuses further use of the pool', () => {
    const pool = KvPool.create({ name: uniqueName(), pages: 2, pageBytes: 128 });
    const view = pool.page(1);
    view.fill(9);
    pool.close();
    pool.close();
    expect(view[127]).toBe(9);
    expect(codeOf(() => pool.page(0))).toBe('TRANSFER_POOL_CLOSED');
    expect(codeOf(() => pool.checksum(0))).toBe('TRANSFER_POOL_CLOSED');
  });

  it('rejects bad arguments with coded errors, before or inside the addon, and never crashes', () => {
    const pool = KvPool.create({ name: uniqueName(), pages: 4, pageBytes: 256 });
    try {
      for (const [fn, code] of [
        [
          () => KvPool.create({ name: 'no-slash', pages: 1, pageBytes: 64 }),
          'TRANSFER_BAD_ARGUMENT',
        ],
        [() => KvPool.create({ name: '/x', pages: 0, pageBytes: 64 }), 'TRANSFER_BAD_ARGUMENT'],
        [() => KvPool.create({ name: '/x', pages: 1.5, pageBytes: 64 }), 'TRANSFER_BAD_ARGUMENT'],
        [() => KvPool.create({ name: '/x', pages: 1, pageBytes: 100 }), 'TRANSFER_BAD_ARGUMENT'],
        [
          () => KvPool.create({ name: '/x', pages: 2 ** 31, pageBytes: 2 ** 20 }),
          'TRANSFER_BAD_ARGUMENT',
        ],
        [() => KvPool.open(`/pdctl-test-missing-${process.pid}`), 'TRANSFER_POOL_NOT_FOUND'],
        [() => pool.page(4), 'TRANSFER_BAD_ARGUMENT'],
        [() => pool.page(-1), 'TRANSFER_BAD_ARGUMENT'],
        [() => pool.checksum(3, 2), 'TRANSFER_BAD_ARGUMENT'],
        [() => pool.read(3, 2), 'TRANSFER_BAD_ARGUMENT'],
        [() => pool.write(3, new Uint8Array(257)), 'TRANSFER_BAD_ARGUMENT'],
        [() => pool.write(0, 'text' as unknown as Uint8Array), 'TRANSFER_BAD_ARGUMENT'],
        [
          () => KvPool.create({ name: '/x', pages: 1, pageBytes: 64, device: -1 }),
          'TRANSFER_BAD_ARGUMENT',
        ],
        [
          () => KvPool.create({ name: '/x', pages: 1, pageBytes: 64, device: 0.5 }),
          'TRANSFER_BAD_ARGUMENT',
        ],
        [() => crc32c('text' as unknown as Uint8Array), 'TRANSFER_BAD_ARGUMENT'],
      ] as const) {
        expect(codeOf(fn)).toBe(code);
      }
      // Straight into the addon, past the TypeScript checks: still an error, not a crash.
      const addon = native();
      for (const fn of [
        () => addon.poolInfo({} as never),
        () => addon.poolPage(null as never, 0),
        () => addon.poolCreate(42 as never, 1, 64, false, null),
        () => addon.poolCreate('/x', 1, 64, false, -3),
        () => addon.poolRead({} as never, 0, new Uint8Array(1)),
        () => addon.poolWrite(pool.handleForTransfer(), 0, new Uint8Array(4 * 256 + 1)),
        () => addon.poolWrite(pool.handleForTransfer(), 0, new Int8Array(4) as never),
        () => addon.poolChecksum({} as never, 0, 1),
        () => addon.crc32c(null as never, false),
      ]) {
        expect(fn).toThrow();
      }
    } finally {
      pool.close();
    }
  });
});

describe('KvPool across processes', () => {
  it('sees every byte another process wrote, and the same checksums', async () => {
    const name = uniqueName();
    const child = await startPoolChild(name, 16, 65536);
    const { written } = child;
    const pool = KvPool.open(name);
    try {
      expect(pool.epoch).toBe(written.epoch);
      for (let i = 0; i < pool.pages; i++) {
        const page = pool.page(i);
        expect(firstWrongByte(page, i), `page ${i}`).toBe(-1);
        expect(pool.checksum(i)).toBe(written.checksums[i]);
        expect(crc32c(page)).toBe(written.checksums[i]);
      }
      expect(pool.checksum(0, pool.pages)).toBe(written.all);
    } finally {
      pool.close();
    }
    expect(await child.finish()).toBe(0);
  });
});
