/**
 * Which prefill engine holds which prefix blocks: a fold of the journal, never of what an engine
 * says outside it. Engines report the blocks their caches stored and evicted on their room events
 * (`room.prefill_started.evictedBlocks`, `room.transfer_posted.storedBlocks` and
 * `.evictedBlocks`); `engine.registered` with a new incarnation empties that engine's entry (a
 * restarted engine's cache is empty). The control plane rebuilds the index from the journal at
 * start — also after a PostgreSQL failover — and folds each committed event after that, so a new
 * control plane routes on the same knowledge as the one before it.
 */
import type { JournalEvent } from '../../journal/events.ts';
import { eachEvent, type JournalReader } from '../../journal/store.ts';

/** Event types the index folds. */
export const INDEX_EVENTS = [
  'engine.registered',
  'room.prefill_started',
  'room.transfer_posted',
] as const;

interface Holdings {
  incarnation: string | null;
  blocks: Set<string>;
}

export class PrefixIndex {
  private readonly engines = new Map<string, Holdings>();

  /** Blocks the index says the engine holds. */
  blocksOn(engine: string): number {
    return this.engines.get(engine)?.blocks.size ?? 0;
  }

  /** How many leading blocks of `names` the engine holds. */
  overlap(engine: string, names: readonly string[]): number {
    const held = this.engines.get(engine)?.blocks;
    if (!held) return 0;
    let n = 0;
    while (n < names.length && held.has(names[n] as string)) n++;
    return n;
  }

  /** Whether the engine holds this block. */
  holds(engine: string, name: string): boolean {
    return this.engines.get(engine)?.blocks.has(name) ?? false;
  }

  /** Folds one committed event (others are ignored). */
  fold(ev: JournalEvent): void {
    const engine = ev.engine;
    if (engine === null) return;
    if (ev.type === 'engine.registered') {
      const h = this.engines.get(engine);
      if (h && h.incarnation === ev.data.incarnation) return;
      this.engines.set(engine, { incarnation: ev.data.incarnation, blocks: new Set() });
      return;
    }
    if (ev.type !== 'room.prefill_started' && ev.type !== 'room.transfer_posted') return;
    const evicted = ev.data.evictedBlocks ?? [];
    const stored = ev.type === 'room.transfer_posted' ? (ev.data.storedBlocks ?? []) : [];
    if (evicted.length === 0 && stored.length === 0) return;
    let h = this.engines.get(engine);
    if (!h) {
      h = { incarnation: null, blocks: new Set() };
      this.engines.set(engine, h);
    }
    for (const name of evicted) h.blocks.delete(name);
    for (const name of stored) h.blocks.add(name);
  }

  /**
   * The index as the journal has it up to `untilSeq`. Finds each engine's last registration (few
   * events), then folds the index's events from the earliest of those on, in one pass.
   */
  static async rebuild(journal: JournalReader, untilSeq: number): Promise<PrefixIndex> {
    const index = new PrefixIndex();
    const last = new Map<string, number>();
    await eachEvent(journal, { type: 'engine.registered' }, (ev) => {
      if (ev.engine && ev.seq <= untilSeq) last.set(ev.engine, ev.seq);
      return ev.seq < untilSeq;
    });
    if (last.size === 0) return index;
    const afterSeq = Math.min(...last.values()) - 1;
    await eachEvent(journal, { type: [...INDEX_EVENTS], afterSeq }, (ev) => {
      if (ev.seq <= untilSeq) index.fold(ev);
      return ev.seq < untilSeq;
    });
    return index;
  }
}
