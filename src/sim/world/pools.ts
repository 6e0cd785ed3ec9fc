/**
 * The simulator's KV pools (issue 41): pages in plain memory, named and opened on one simulated
 * host (`MemoryPools`), with the epochs a re-created pool gets counted, not read off a clock, so
 * that a run repeats exactly. Checksums are the same CRC32C the native pools compute.
 */
import { TransferError } from '../../transfer/errors.ts';
import type { PagePool } from '../../transfer/page-pool.ts';
import { crc32c } from '../../transfer/pool.ts';

/** The memory of one pool, shared by every handle opened on it. */
interface Store {
  bytes: Uint8Array;
  /** A pool created since under the same name: transfers prepared for this one are refused. */
  retired: boolean;
}

/** One handle on a pool, as a `KvPool` is one mapping: closing it leaves the others open. */
export class MemoryPool implements PagePool {
  readonly device = null;
  private bytes: Uint8Array | null;

  constructor(
    readonly name: string,
    readonly pages: number,
    readonly pageBytes: number,
    readonly epoch: number,
    readonly store: Store = newStore(pages, pageBytes),
  ) {
    this.bytes = store.bytes;
  }

  /** Whether a pool was created under this name since (the transfer core checks it). */
  get retired(): boolean {
    return this.store.retired;
  }

  get closed(): boolean {
    return this.bytes === null;
  }

  private live(first: number, count: number): Uint8Array {
    if (!this.bytes) throw new TransferError('TRANSFER_POOL_CLOSED', `pool ${this.name} is closed`);
    if (
      !Number.isInteger(first) ||
      !Number.isInteger(count) ||
      first < 0 ||
      count < 1 ||
      first + count > this.pages
    )
      throw new TransferError(
        'TRANSFER_BAD_ARGUMENT',
        `pages ${first}..${first + count - 1} are out of range: pool ${this.name} has ${this.pages}`,
      );
    return this.bytes;
  }

  page(index: number): Uint8Array {
    const b = this.live(index, 1);
    return b.subarray(index * this.pageBytes, (index + 1) * this.pageBytes);
  }

  read(first: number, count = 1): Uint8Array {
    const b = this.live(first, count);
    return b.slice(first * this.pageBytes, (first + count) * this.pageBytes);
  }

  write(first: number, data: Uint8Array): void {
    const b = this.live(first, Math.max(1, Math.ceil(data.length / this.pageBytes)));
    b.set(data, first * this.pageBytes);
  }

  checksumPages(pages: readonly number[]): string {
    const all = new Uint8Array(pages.length * this.pageBytes);
    for (const [i, p] of pages.entries()) all.set(this.page(p), i * this.pageBytes);
    return crc32c(all);
  }

  close(): void {
    this.bytes = null;
  }
}

function newStore(pages: number, pageBytes: number): Store {
  if (!Number.isInteger(pages) || pages < 1)
    throw new TransferError(
      'TRANSFER_BAD_ARGUMENT',
      `pages must be a whole number ≥ 1, got ${pages}`,
    );
  if (!Number.isInteger(pageBytes) || pageBytes < 64 || pageBytes % 64 !== 0)
    throw new TransferError(
      'TRANSFER_BAD_ARGUMENT',
      `pageBytes must be a positive multiple of 64, got ${pageBytes}`,
    );
  return { bytes: new Uint8Array(pages * pageBytes), retired: false };
}

/** The pools of one simulated host, by name: what `KvPool.create` and `KvPool.open` are to shared memory. */
export class MemoryPools {
  private readonly byName = new Map<string, MemoryPool>();
  private epochs = 0;

  /** A new pool under `name` (a new epoch), replacing the one there was. */
  create(name: string, pages: number, pageBytes: number): MemoryPool {
    const before = this.byName.get(name);
    if (before) before.store.retired = true;
    const pool = new MemoryPool(name, pages, pageBytes, ++this.epochs);
    this.byName.set(name, pool);
    return pool;
  }

  /** A new handle on the pool now under `name`; TRANSFER_POOL_NOT_FOUND when there is none. */
  open(name: string): MemoryPool {
    const pool = this.byName.get(name);
    if (!pool)
      throw new TransferError('TRANSFER_POOL_NOT_FOUND', `no pool named ${name} on this host`);
    return new MemoryPool(name, pool.pages, pool.pageBytes, pool.epoch, pool.store);
  }

  unlink(name: string): void {
    this.byName.delete(name);
  }
}
