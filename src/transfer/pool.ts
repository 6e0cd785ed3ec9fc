/**
 * KV page pools: named shared-memory regions of `pages` pages of `pageBytes` bytes, one per engine,
 * that every process on the host can open by name (docs/design.md §6). Pages are handed out as
 * Uint8Array views over the shared memory itself: the model writes KV into them and reads from
 * them without a copy. Arguments are checked here, with coded errors, before the addon sees them.
 *
 * A device pool (`device: N`) keeps its pages in the memory of CUDA device N; only its header is
 * in shared memory, with the IPC handle through which other processes map the pages. Its pages
 * cannot be viewed from JavaScript, only copied with read() and write(); transfers move them with
 * the GPU's copy engines.
 */
import { nativeCall, TransferError } from './errors.ts';
import { native, type PoolHandle } from './native.ts';
import type { PagePool } from './page-pool.ts';

/** POSIX shared-memory names: one leading slash, then at most 200 of these characters. */
const NAME_RE = /^\/[A-Za-z0-9._-]{1,200}$/;

/** The shared-memory name `pdctl engine` gives its KV pool unless told otherwise. */
export function defaultPoolName(engine: string, pid: number): string {
  return `/pdctl-${engine.replace(/[^A-Za-z0-9._-]/g, '_')}-${pid}`;
}
/** Most bytes one pool may map: 64 GiB. */
export const MAX_POOL_BYTES = 64 * 2 ** 30;

export interface PoolOptions {
  /** Shared-memory name, e.g. `/pdctl-d0`. */
  name: string;
  pages: number;
  /** Bytes per page; a multiple of 64 so pages stay cache-line aligned. */
  pageBytes: number;
  /** Re-create the pool when the name exists (a new epoch). Default false: that is an error. */
  replace?: boolean;
  /**
   * A CUDA device ordinal: the pages live in that GPU's memory. Absent: host shared memory.
   * Fails with TRANSFER_BACKEND_UNAVAILABLE where there is no CUDA or no such device.
   */
  device?: number;
}

function bad(message: string): TransferError {
  return new TransferError('TRANSFER_BAD_ARGUMENT', message);
}

function checkName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || !NAME_RE.test(name)) {
    throw bad(
      `pool name must be "/" and 1-200 letters, digits, ".", "_" or "-", got ${JSON.stringify(name)}`,
    );
  }
}

export class KvPool implements PagePool {
  readonly name: string;
  readonly pages: number;
  readonly pageBytes: number;
  /** Changes whenever the pool is re-created; transfers name the epoch they were prepared for. */
  readonly epoch: number;
  /** The CUDA device holding the pages, or null for host shared memory. */
  readonly device: number | null;
  private handle: PoolHandle | null;

  private constructor(handle: PoolHandle) {
    const info = nativeCall(() => native().poolInfo(handle));
    this.handle = handle;
    this.name = info.name;
    this.pages = info.pages;
    this.pageBytes = info.pageBytes;
    this.epoch = info.epoch;
    this.device = info.device;
  }

  /** Creates a pool; fails with TRANSFER_POOL_EXISTS if the name is taken, unless `replace`. */
  static create(options: PoolOptions): KvPool {
    const { name, pages, pageBytes } = options;
    checkName(name);
    if (!Number.isInteger(pages) || pages < 1 || pages > 0xffffffff) {
      throw bad(`pages must be an integer from 1 to 4294967295, got ${pages}`);
    }
    if (!Number.isInteger(pageBytes) || pageBytes < 64 || pageBytes % 64 !== 0) {
      throw bad(`pageBytes must be a positive multiple of 64, got ${pageBytes}`);
    }
    if (pages * pageBytes > MAX_POOL_BYTES) {
      throw bad(`a pool of ${pages} pages of ${pageBytes} B exceeds ${MAX_POOL_BYTES} B`);
    }
    const { device } = options;
    if (device !== undefined && (!Number.isInteger(device) || device < 0 || device > 1023)) {
      throw bad(`device must be a CUDA device ordinal from 0 to 1023, got ${device}`);
    }
    return new KvPool(
      nativeCall(() =>
        native().poolCreate(name, pages, pageBytes, options.replace === true, device ?? null),
      ),
    );
  }

  /** Opens a pool another process created; TRANSFER_POOL_NOT_FOUND if there is none. */
  static open(name: string): KvPool {
    checkName(name);
    return new KvPool(nativeCall(() => native().poolOpen(name)));
  }

  /** Removes the name, so that it can be created anew; open mappings stay valid. */
  static unlink(name: string): boolean {
    checkName(name);
    return nativeCall(() => native().poolUnlink(name));
  }

  get closed(): boolean {
    return this.handle === null;
  }

  private live(): PoolHandle {
    if (!this.handle)
      throw new TransferError('TRANSFER_POOL_CLOSED', `pool ${this.name} is closed`);
    return this.handle;
  }

  private checkRange(first: number, count: number): void {
    if (!Number.isInteger(first) || first < 0 || first >= this.pages) {
      throw bad(`page ${first} is out of range: pool ${this.name} has pages 0..${this.pages - 1}`);
    }
    if (!Number.isInteger(count) || count < 1 || first + count > this.pages) {
      throw bad(
        `pages ${first}..${first + count - 1} are out of range: pool ${this.name} has ${this.pages}`,
      );
    }
  }

  /**
   * A view of one page over the shared memory itself (no copy). It stays valid after close().
   * A device pool has none: use read() and write().
   */
  page(index: number): Uint8Array {
    const handle = this.live();
    this.checkRange(index, 1);
    if (this.device !== null) {
      throw bad(
        `pool ${this.name} is in the memory of CUDA device ${this.device}: its pages cannot be viewed, use read() and write()`,
      );
    }
    return new Uint8Array(nativeCall(() => native().poolPage(handle, index)));
  }

  /** A copy of `count` pages from `first` (through CUDA for a device pool). */
  read(first: number, count = 1): Uint8Array {
    const handle = this.live();
    this.checkRange(first, count);
    const out = new Uint8Array(count * this.pageBytes);
    nativeCall(() => native().poolRead(handle, first, out));
    return out;
  }

  /** Copies `data` into the pool from page `first` on; it may end inside a page. */
  write(first: number, data: Uint8Array): void {
    const handle = this.live();
    if (!(data instanceof Uint8Array) || data.length === 0) {
      throw bad('data must be a non-empty Uint8Array');
    }
    this.checkRange(first, Math.ceil(data.length / this.pageBytes));
    nativeCall(() => native().poolWrite(handle, first, data));
  }

  /** CRC32C of `count` pages from `first`, as 8 hex digits. */
  checksum(first: number, count = 1): string {
    const handle = this.live();
    this.checkRange(first, count);
    return (nativeCall(() => native().poolChecksum(handle, first, count)) >>> 0)
      .toString(16)
      .padStart(8, '0');
  }

  /** CRC32C over the listed pages in order, as 8 hex digits: how a destination checks a transfer. */
  checksumPages(pages: readonly number[]): string {
    const handle = this.live();
    for (const p of pages) this.checkRange(p, 1);
    return (nativeCall(() => native().poolChecksumPages(handle, Uint32Array.from(pages))) >>> 0)
      .toString(16)
      .padStart(8, '0');
  }

  /** The addon's handle, for the transfer core in this folder. */
  handleForTransfer(): PoolHandle {
    return this.live();
  }

  /** Unmaps once no page view is left; idempotent. Does not remove the name (see unlink). */
  close(): void {
    if (!this.handle) return;
    native().poolClose(this.handle);
    this.handle = null;
  }
}

/** The pool as the native transfer core and UCX need it: a `KvPool`, or an error that says so. */
export function nativePool(pool: PagePool): KvPool {
  if (pool instanceof KvPool) return pool;
  throw bad(
    `pool ${pool.name} is not in shared memory or on a device: the native transfer core cannot move its pages`,
  );
}

/** CRC32C of bytes, as 8 hex digits; `software` forces the table path (for tests). */
export function crc32c(data: Uint8Array, options: { software?: boolean } = {}): string {
  if (!(data instanceof Uint8Array)) throw bad('crc32c needs a Uint8Array');
  return (nativeCall(() => native().crc32c(data, options.software === true)) >>> 0)
    .toString(16)
    .padStart(8, '0');
}

/** What the transfer core can use on this machine. */
export function backends(): ReturnType<ReturnType<typeof native>['backends']> {
  return native().backends();
}
