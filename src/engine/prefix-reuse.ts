/**
 * What a prefill engine reuses of prompts it computed before, whichever keeps them — its pool (a
 * PrefixCache, for models whose KV lies there position by position) or its model runtime
 * (`heldPrefixes`, llama.cpp's sequences) — and what it reports of them on the room's events
 * (docs/design.md §12). The prefill path calls `begin` before it reserves pages, `evictFor` when
 * it finds none, `restore` before the compute and `finish` after it.
 */

import type { EngineModel, PositionalKv } from '../model/executor.ts';
import { blockNames } from '../model/prefix-blocks.ts';
import type { PagePool } from '../transfer/page-pool.ts';
import type { PageAllocator } from './allocator.ts';
import { type RoomKv, roomKv } from './kv-pages.ts';
import { PrefixCache } from './prefix-cache.ts';

/** What the engine's hello and heartbeat say of it. */
export interface PrefixAnnounce {
  blockTokens: number;
  /** The most blocks it can hold. */
  capacityBlocks: number;
  /** Blocks it holds now. */
  blocks: number;
}

/** The block fields of a room's `room.transfer_posted`. */
export interface BlockReport {
  reusedBlocks?: number;
  storedBlocks?: string[];
  evictedBlocks?: string[];
}

export class PrefixReuse {
  /** Blocks of what the model runtime holds, as last reported to the journal. */
  private readonly reported = new Set<string>();

  private constructor(
    private readonly model: EngineModel,
    private readonly pool: PagePool,
    readonly blockTokens: number,
    /** Blocks in the pool; null where the model runtime keeps prefixes itself. */
    private readonly cache: PrefixCache | null,
  ) {}

  /**
   * The engine's prefix reuse: a pool cache of `budgetPages` (`pagesPerBlock` pages a block)
   * where the model's KV is positional, the runtime's where it keeps prefixes; null: neither, or
   * a budget of 0 (`--prefix-cache-pages 0` turns reuse off for both).
   */
  static for(o: {
    model: EngineModel;
    pool: PagePool;
    allocator: PageAllocator;
    blockTokens: number;
    budgetPages: number;
    pagesPerBlock: number;
  }): PrefixReuse | null {
    const { model, pool, blockTokens, budgetPages, pagesPerBlock } = o;
    if (model.positionalKv && budgetPages > 0 && pagesPerBlock <= budgetPages) {
      const cache = new PrefixCache(o.allocator, { blockTokens, pagesPerBlock, budgetPages });
      return new PrefixReuse(model, pool, blockTokens, cache);
    }
    return model.heldPrefixes && budgetPages > 0
      ? new PrefixReuse(model, pool, blockTokens, null)
      : null;
  }

  announce(): PrefixAnnounce {
    const { blockTokens, cache } = this;
    if (cache) return { blockTokens, capacityBlocks: cache.capacityBlocks, blocks: cache.size };
    const tokens = (this.model.slots ?? 1) * (this.model.contextSize ?? 0);
    const capacityBlocks = Math.floor(tokens / blockTokens);
    return { blockTokens, capacityBlocks, blocks: this.reported.size };
  }

  /** Pool pages held by cached blocks no room is copying from: a room may have them. */
  get evictablePages(): number {
    return this.cache?.evictablePages ?? 0;
  }

  /**
   * The names of the context's blocks, and the pages of its leading blocks in the pool cache,
   * pinned for `room` until `restore` or `unpin`.
   */
  begin(room: string, tokens: readonly number[]): { names: string[]; hits: number[][] } {
    const names = blockNames(tokens, this.blockTokens);
    return { names, hits: this.cache?.pin(room, names) ?? [] };
  }

  /** Rooms first: evicts unpinned cached blocks until the pool has `pages` free; their names. */
  evictFor(pages: number): string[] {
    return this.cache?.evictFor(pages) ?? [];
  }

  /** Copies the cached blocks' KV into the room's pages and unpins them; the positions restored. */
  restore(room: string, hits: readonly number[][], kv: RoomKv): number {
    const copy = this.model.positionalKv as PositionalKv;
    const b = this.blockTokens;
    hits.forEach((pages, i) => {
      copy.copy(roomKv(this.pool, pages, 'load').pages, 0, kv.pages, i * b, b);
    });
    this.unpin(room);
    return hits.length * b;
  }

  unpin(room: string): void {
    this.cache?.unpin(room);
  }

  /**
   * After the room's prefill: keeps its blocks the pool cache lacks, or takes stock of what the
   * runtime holds; returns what the room's `room.transfer_posted` reports. `reusedPositions`:
   * what the model runtime reused (llama.cpp), where the pool cache did not.
   */
  finish(
    names: readonly string[],
    hits: readonly number[][],
    kv: RoomKv,
    reusedPositions: number,
  ): BlockReport {
    if (names.length === 0) return {};
    const { stored, evicted } = this.cache ? this.keep(names, kv) : this.held(names);
    const reusedBlocks = this.cache ? hits.length : Math.floor(reusedPositions / this.blockTokens);
    return {
      reusedBlocks,
      ...(stored.length > 0 ? { storedBlocks: stored } : {}),
      ...(evicted.length > 0 ? { evictedBlocks: evicted } : {}),
    };
  }

  /** Keeps the room's blocks the cache lacks (within its budget): the names stored and evicted. */
  private keep(names: readonly string[], kv: RoomKv): { stored: string[]; evicted: string[] } {
    const copy = this.model.positionalKv as PositionalKv;
    const b = this.blockTokens;
    const { stored, evicted } = (this.cache as PrefixCache).store(names);
    for (const s of stored) {
      const block = roomKv(this.pool, s.pages, 'empty');
      copy.copy(kv.pages, s.index * b, block.pages, 0, b);
      block.store();
    }
    return { stored: stored.map((s) => s.name), evicted };
  }

  /**
   * What the model runtime holds now against what was last reported: the room's blocks it holds
   * that were not reported (blocks of other rooms are theirs to report), and every reported block
   * it no longer holds.
   */
  private held(names: readonly string[]): { stored: string[]; evicted: string[] } {
    const prefixes = this.model.heldPrefixes?.() ?? [];
    const now = new Set(prefixes.flatMap((t) => blockNames(t, this.blockTokens)));
    const evicted = [...this.reported].filter((n) => !now.has(n));
    for (const n of evicted) this.reported.delete(n);
    const stored = names.filter((n) => now.has(n) && !this.reported.has(n));
    for (const n of stored) this.reported.add(n);
    return { stored, evicted };
  }
}
