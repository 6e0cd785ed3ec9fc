/**
 * A room's KV pages as the model sees them. In a host pool they are views of the shared memory
 * itself (no copy). In a device pool (`--kv-device`) the model here, which computes on the CPU,
 * works on host copies: `load` reads the pages from the GPU, and `store()` writes them back
 * before the transfer moves them GPU to GPU. (A GPU model would write device memory itself.)
 */

import type { PagePool } from '../transfer/page-pool.ts';

export interface RoomKv {
  pages: readonly Uint8Array[];
  /** Makes what the model wrote visible in the pool (a no-op for a host pool). */
  store(): void;
}

export function roomKv(pool: PagePool, pages: readonly number[], start: 'empty' | 'load'): RoomKv {
  if (pool.device === null) return { pages: pages.map((p) => pool.page(p)), store: () => {} };
  const copies = pages.map((p) =>
    start === 'load' ? pool.read(p) : new Uint8Array(pool.pageBytes),
  );
  return {
    pages: copies,
    store: () => {
      for (let i = 0; i < pages.length; i++)
        pool.write(pages[i] as number, copies[i] as Uint8Array);
    },
  };
}
