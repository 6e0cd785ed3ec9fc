/**
 * What an engine needs of a KV pool, whoever keeps its pages: `KvPool` (shared memory or a CUDA
 * device, pool.ts) in every real process, `MemoryPool` (memory/pool.ts) in the simulator. Only the
 * native transfer core and UCX need a `KvPool` itself (`nativePool`).
 */
export interface PagePool {
  readonly name: string;
  readonly pages: number;
  readonly pageBytes: number;
  /** Changes whenever the pool is re-created; transfers name the epoch they were prepared for. */
  readonly epoch: number;
  /** The CUDA device holding the pages, or null for host memory. */
  readonly device: number | null;
  readonly closed: boolean;
  /** A view of one page (no copy); a device pool has none. */
  page(index: number): Uint8Array;
  /** A copy of `count` pages from `first`. */
  read(first: number, count?: number): Uint8Array;
  /** Copies `data` into the pool from page `first` on. */
  write(first: number, data: Uint8Array): void;
  /** CRC32C over the listed pages in order, as 8 hex digits: how a destination checks a transfer. */
  checksumPages(pages: readonly number[]): string;
  close(): void;
}

/** How an engine opens another engine's pool by its name (the decode pool a room's KV goes to). */
export type PoolOpener = (name: string) => PagePool;
