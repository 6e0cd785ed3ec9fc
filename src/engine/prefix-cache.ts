/**
 * A prefill engine's prefix cache: the KV of prompt blocks it computed (model/prefix-blocks.ts
 * names them), kept in pages of its own pool within a budget, so that a room whose context starts
 * with cached blocks computes only the rest.
 *
 * - A block's pages come from the pool's page allocator, held under a key no room id can take.
 * - Least recently used blocks go first; a room's blocks are touched last block first, so that a
 *   prefix loses its tail before its head (a head without its tail is still a hit, a tail without
 *   its head never is).
 * - Blocks a room is copying from are pinned until it is done with them.
 * - Rooms first: a room that finds no free pages evicts unpinned blocks (`evictFor`), so a cache
 *   that fills never starves rooms; the heartbeat counts unpinned cached pages as free.
 */
import type { PageAllocator } from './allocator.ts';

export interface PrefixCacheOptions {
  /** Tokens per block (`--kv-block-tokens`). */
  blockTokens: number;
  /** Pool pages one block's KV takes. */
  pagesPerBlock: number;
  /** Most pool pages the cache may hold (`--prefix-cache-pages`). */
  budgetPages: number;
}

/** A block `store` took pages for: the `index`-th of the names it was given. */
export interface StoredBlock {
  name: string;
  index: number;
  pages: number[];
}

interface CachedBlock {
  pages: number[];
  pins: number;
}

/** Keys of blocks in the page allocator: `#` is not a character of room ids. */
const key = (name: string) => `#prefix/${name}`;

export class PrefixCache {
  /** Held blocks, least recently used first (a Map keeps insertion order). */
  private readonly blocks = new Map<string, CachedBlock>();
  /** Blocks each room has pinned. */
  private readonly pinned = new Map<string, string[]>();
  /** Blocks put in and taken out since start (the heartbeat's counters). */
  stored = 0;
  evicted = 0;

  constructor(
    private readonly allocator: PageAllocator,
    readonly o: Readonly<PrefixCacheOptions>,
  ) {}

  /** Blocks held now. */
  get size(): number {
    return this.blocks.size;
  }

  /** Pool pages the cache holds. */
  get pages(): number {
    return this.blocks.size * this.o.pagesPerBlock;
  }

  /** Pages a room could have by evicting: held by blocks no room is copying from. */
  get evictablePages(): number {
    let n = 0;
    for (const b of this.blocks.values()) if (b.pins === 0) n += b.pages.length;
    return n;
  }

  /** The most blocks the budget holds. */
  get capacityBlocks(): number {
    return Math.floor(this.o.budgetPages / this.o.pagesPerBlock);
  }

  has(name: string): boolean {
    return this.blocks.has(name);
  }

  /**
   * How many leading blocks of `names` are held, with their pages, pinned for `room` until
   * `unpin(room)`; they become the most recently used.
   */
  pin(room: string, names: readonly string[]): number[][] {
    if (this.pinned.has(room)) throw new Error(`room ${room} already pins prefix blocks`);
    let n = 0;
    while (n < names.length && this.blocks.has(names[n] as string)) n++;
    const hit = names.slice(0, n);
    this.touch(hit);
    for (const name of hit) (this.blocks.get(name) as CachedBlock).pins++;
    this.pinned.set(room, hit);
    return hit.map((name) => (this.blocks.get(name) as CachedBlock).pages);
  }

  unpin(room: string): void {
    for (const name of this.pinned.get(room) ?? []) {
      const b = this.blocks.get(name);
      if (b) b.pins--;
    }
    this.pinned.delete(room);
  }

  /**
   * Evicts least recently used unpinned blocks until the pool has `pages` free pages; evicts
   * nothing (and returns no names) when even all of them would not make enough.
   */
  evictFor(pages: number): string[] {
    const out: string[] = [];
    if (this.allocator.free + this.evictablePages < pages) return out;
    for (const [name, b] of this.blocks) {
      if (this.allocator.free >= pages) break;
      if (b.pins > 0) continue;
      this.drop(name);
      out.push(name);
    }
    return out;
  }

  /**
   * Takes pages for each of `names` not held yet, within the budget (evicting least recently
   * used unpinned blocks of other prefixes) and while the pool has free pages; the caller copies
   * each stored block's KV into its pages. A prefix is stored from its head: the first block that
   * cannot be stored ends it (its successors could never be hit).
   */
  store(names: readonly string[]): { stored: StoredBlock[]; evicted: string[] } {
    const stored: StoredBlock[] = [];
    const evicted: string[] = [];
    const own = new Set(names);
    for (const [index, name] of names.entries()) {
      if (this.blocks.has(name)) continue;
      while (this.pages + this.o.pagesPerBlock > this.o.budgetPages) {
        const victim = this.oldestUnpinned(own);
        if (victim === null) break;
        this.drop(victim);
        evicted.push(victim);
      }
      if (this.pages + this.o.pagesPerBlock > this.o.budgetPages) break;
      const pages = this.allocator.reserve(key(name), this.o.pagesPerBlock);
      if (!pages) break;
      this.blocks.set(name, { pages, pins: 0 });
      stored.push({ name, index, pages });
      this.stored++;
    }
    this.touch(names.filter((n) => this.blocks.has(n)));
    return { stored, evicted };
  }

  /** Drops every block (the pool is gone, or a test). */
  clear(): void {
    for (const name of [...this.blocks.keys()]) this.drop(name);
    this.pinned.clear();
  }

  /** Makes `names` the most recently used, the first of them most of all. */
  private touch(names: readonly string[]): void {
    for (let i = names.length - 1; i >= 0; i--) {
      const name = names[i] as string;
      const b = this.blocks.get(name);
      if (!b) continue;
      this.blocks.delete(name);
      this.blocks.set(name, b);
    }
  }

  private oldestUnpinned(except: ReadonlySet<string>): string | null {
    for (const [name, b] of this.blocks) if (b.pins === 0 && !except.has(name)) return name;
    return null;
  }

  private drop(name: string): void {
    this.allocator.release(key(name));
    this.blocks.delete(name);
    this.evicted++;
  }
}
