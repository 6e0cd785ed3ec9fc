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
}

export interface NativeBackends {
  shm: true;
  crc32cHardware: boolean;
  cuda: { available: boolean; reason: string; devices?: number };
}

export interface NativeAddon {
  poolCreate(name: string, pages: number, pageBytes: number, replace: boolean): PoolHandle;
  poolOpen(name: string): PoolHandle;
  poolInfo(handle: PoolHandle): NativePoolInfo;
  poolPage(handle: PoolHandle, index: number): ArrayBuffer;
  /** CRC32C of `count` pages from `first`, as an unsigned 32-bit number. */
  poolChecksum(handle: PoolHandle, first: number, count: number): number;
  poolClose(handle: PoolHandle): void;
  /** Removes the name; mappings already open stay valid. True if it existed. */
  poolUnlink(name: string): boolean;
  crc32c(data: Uint8Array, software: boolean): number;
  backends(): NativeBackends;
}

/** `native/build/Release/pdctl_native.node`, the same from `src/transfer` and `dist/transfer`. */
const ADDON_PATH = fileURLToPath(
  new URL('../../native/build/Release/pdctl_native.node', import.meta.url),
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
