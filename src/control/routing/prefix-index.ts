/**
 * Which prefill engine holds which prefix blocks: a fold of the journal, never of what an engine
 * says outside it. Engines report the blocks their caches stored and evicted on their room events
 * (`room.prefill_started.evictedBlocks`, `room.transfer_posted.storedBlocks` and
 * `.evictedBlocks`); `engine.registered` with a new incarnation empties that engine's entry (a
 * restarted engine's cache is empty). The control plane rebuilds the index at start — also after
 * a PostgreSQL failover — from its state checkpoint and the events after it (control/checkpoint),
 * and folds each committed event after that, so a new control plane routes on the same knowledge
 * as the one before it.
 */
import type { JournalEvent } from '../../room/events.ts';

/** Event types the index folds. */
export const INDEX_EVENTS = [
  'engine.registered',
  'room.prefill_started',
  'room.transfer_posted',
] as const;

/** Each engine's incarnation and blocks, as a checkpoint stores them. */
export type IndexSnapshot = Record<string, { incarnation: string | null; blocks: string[] }>;

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

  /** What it holds, as plain data (a state checkpoint keeps it: control/checkpoint). */
  snapshot(): IndexSnapshot {
    const out: IndexSnapshot = {};
    for (const [engine, h] of this.engines)
      out[engine] = { incarnation: h.incarnation, blocks: [...h.blocks] };
    return out;
  }

  /** The index a snapshot describes. */
  static from(snapshot: IndexSnapshot): PrefixIndex {
    const index = new PrefixIndex();
    for (const [engine, h] of Object.entries(snapshot))
      index.engines.set(engine, { incarnation: h.incarnation, blocks: new Set(h.blocks) });
    return index;
  }
}
