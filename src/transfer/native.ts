/**
 * Everything the native addon (native/) exports, and the one place that loads it. Other modules
 * import this file, never the `.node` binary. Handles are opaque; page views are ArrayBuffers over
 * shared memory (no copy), which keep their pool's mapping alive for as long as they live.
 */
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';

/** An open pool, as the addon knows it. Only ever passed back to the addon. */
export type PoolHandle = { readonly __brand: 'PoolHandle' };

export interface NativePoolInfo {
  name: string;
  pages: number;
  pageBytes: number;
  /** Random, drawn at creation; a re-created pool has another. Below 2^53. */
  epoch: number;
  createdMs: number;
  /** The CUDA device holding the pages, or null for host shared memory. */
  device: number | null;
}

export interface NativeBackends {
  shm: true;
  crc32cHardware: boolean;
  /** `reason` names the library and device count, or says why there is no CUDA. */
  cuda: { available: boolean; reason: string; devices: number };
}

/** The network backend: `reason` names the UCX version, or says why there is none. */
export interface NativeUcxBackend {
  available: boolean;
  reason: string;
  version: string | null;
}

/** A UCX node (context, worker and its progress thread), as the addon knows it. */
export type UcxHandle = { readonly __brand: 'UcxHandle' };

export interface NativeAddon {
  /** `device`: a CUDA device ordinal for a device pool, null for host shared memory. */
  poolCreate(
    name: string,
    pages: number,
    pageBytes: number,
    replace: boolean,
    device: number | null,
  ): PoolHandle;
  poolOpen(name: string): PoolHandle;
  poolInfo(handle: PoolHandle): NativePoolInfo;
  poolPage(handle: PoolHandle, index: number): ArrayBuffer;
  /** CRC32C of `count` pages from `first`, as an unsigned 32-bit number. */
  poolChecksum(handle: PoolHandle, first: number, count: number): number;
  /** CRC32C over the listed pages, in order. */
  poolChecksumPages(handle: PoolHandle, pages: Uint32Array): number;
  /** Copies `data.length` bytes from page `first` on into `data` (through CUDA for a device pool). */
  poolRead(handle: PoolHandle, first: number, data: Uint8Array): void;
  /** Copies `data` into the pool from page `first` on. */
  poolWrite(handle: PoolHandle, first: number, data: Uint8Array): void;
  poolClose(handle: PoolHandle): void;
  /** Removes the name; mappings already open stay valid. True if it existed. */
  poolUnlink(name: string): boolean;
  crc32c(data: Uint8Array, software: boolean): number;
  backends(): NativeBackends;
  /**
   * bench:transfer's baseline: bare memcpy of `bytes` from src's first page into dst's, `rounds`
   * times (a synchronous cudaMemcpy when either pool is on a device).
   */
  memcpyNanos(src: PoolHandle, dst: PoolHandle, bytes: number, rounds: number): number;
  /** `onComplete` is called on the JS thread for every transfer that was queued. */
  workersCreate(threads: number, onComplete: (result: NativeTransferResult) => void): WorkersHandle;
  /** Null when queued; a result when the transfer could not start (epoch mismatch, closed). */
  workersPost(
    workers: WorkersHandle,
    id: number,
    room: string,
    src: PoolHandle,
    dst: PoolHandle,
    pairs: Uint32Array,
    epoch: number,
    deadlineMs: number,
  ): NativeTransferResult | null;
  workersCancel(workers: WorkersHandle, room: string): number;
  workersInject(workers: WorkersHandle, room: string, kind: NativeFaultKind, ms: number): void;
  workersClearFaults(workers: WorkersHandle): void;
  workersStats(workers: WorkersHandle): NativeTransferStats;
  workersClose(workers: WorkersHandle): void;
  /** Loads UCX (only a process that asks has it) and says whether it is usable, and why not. */
  ucxBackend(): NativeUcxBackend;
  /** Throws TRANSFER_BACKEND_UNAVAILABLE (with the reason) where UCX cannot be set up. */
  ucxCreate(onComplete: (result: NativeTransferResult) => void): UcxHandle;
  /** The worker's address: what a peer needs to reach this node. */
  ucxAddress(node: UcxHandle): Buffer;
  /**
   * Queues a send of `pages` of `src`, in that order, to the peer worker at `address`: one tagged
   * message under the tag of (room, epoch); it completes once the receiver matched it.
   */
  ucxPost(
    node: UcxHandle,
    id: number,
    room: string,
    epoch: number,
    src: PoolHandle,
    address: Buffer,
    pages: Uint32Array,
    deadlineMs: number,
  ): null;
  /** Posts a receive of the room's message into `pages` of `dst`; completes through onComplete. */
  ucxReceive(
    node: UcxHandle,
    id: number,
    room: string,
    epoch: number,
    dst: PoolHandle,
    pages: Uint32Array,
  ): null;
  ucxCancel(node: UcxHandle, room: string): number;
  ucxInject(node: UcxHandle, room: string, kind: NativeFaultKind, ms: number): void;
  ucxClearFaults(node: UcxHandle): void;
  /**
   * Null when an endpoint to a peer's worker address can be made; else why. UCX aborts the
   * process on a malformed address: call it only in a throwaway process (src/transfer/ucx-check.ts).
   */
  ucxCheckPeer(address: Buffer): string | null;
  ucxClose(node: UcxHandle): void;
}

/** The transfer core's pool of copy threads, as the addon knows it (not an inference engine). */
export type WorkersHandle = { readonly __brand: 'WorkersHandle' };

export type NativeFaultKind = 'none' | 'stall' | 'delay' | 'corrupt' | 'fail';

export interface NativeTransferResult {
  id: number;
  room: string;
  status: 'ok' | 'cancelled' | 'stalled' | 'epoch_mismatch' | 'failed';
  bytes: number;
  micros: number;
  /** CRC32C of the source bytes in pair order (unsigned 32-bit). */
  checksum: number;
  error: string | null;
}

export interface NativeTransferStats {
  bytes: number;
  queued: number;
  running: number;
  ok: number;
  cancelled: number;
  stalled: number;
  epochMismatch: number;
  failed: number;
}

/** `native/build/Release/pdctl_native.node`, the same from `src/transfer` and `dist/transfer`. */
const ADDON_PATH = fileURLToPath(
  new URL('../../native/build/Release/pdctl_native.node', import.meta.url),
);

/**
 * The stand-in CUDA runtime built beside the addon (native/test/fake-cudart.cc): point
 * `PDCTL_CUDART` at it to exercise the CUDA backend without a GPU. Tests only.
 */
export const FAKE_CUDART_PATH = fileURLToPath(
  new URL('../../native/build/Release/pdctl_fake_cudart.so', import.meta.url),
);

let addon: NativeAddon | null = null;

export function native(): NativeAddon {
  if (!addon) {
    try {
      addon = createRequire(import.meta.url)(ADDON_PATH) as NativeAddon;
    } catch (err) {
      throw new Error(
        `the pdctl native addon is not built (${ADDON_PATH}); run \`npm run build:native\``,
        {
          cause: err,
        },
      );
    }
  }
  return addon;
}
