/**
 * Which pages of each decode engine's pool are held by which live room, folded from committed
 * events: a decode engine's `room.bootstrapped` names the pages it reserved for a room, its
 * `room.released` frees them, and `engine.registered` with a new incarnation starts it with none
 * (a restarted engine has a new pool).
 *
 * Today the map only watches (docs/critical-path.md, increment 2): a page a decode engine
 * reserves while the map still holds it for another room is a conflict, counted
 * (`pdctl_page_map_conflicts_total`). None is possible if the argument of the redesign holds — an
 * engine frees a page before its `room.released`, the map only once that commits — and a run
 * without conflicts is the evidence for letting the map choose the pages itself. It starts empty:
 * rooms in flight when the control plane started are not in it, so it can miss a conflict on
 * their pages but never report a false one.
 */
import type { JournalEvent } from '../../journal/events.ts';

/** One conflict: a page reserved for `room` while the map held it for `heldBy`. */
export interface PageConflict {
  engine: string;
  page: number;
  room: string;
  heldBy: string;
}

interface Pool {
  incarnation: string | null;
  /** Room holding each page. */
  owner: Map<number, string>;
  /** Pages of each room. */
  pages: Map<string, readonly number[]>;
}

export class PageMap {
  private readonly pools = new Map<string, Pool>();
  /** Conflicts seen since this control plane started. */
  conflicts = 0;
  /** The latest conflict, for whoever looks (null: none). */
  lastConflict: PageConflict | null = null;

  /** Pages the map holds for rooms on this engine. */
  heldOn(engine: string): number {
    return this.pools.get(engine)?.owner.size ?? 0;
  }

  /** Folds one committed event (others are ignored); returns the conflicts it found. */
  fold(ev: JournalEvent): PageConflict[] {
    const engine = ev.engine;
    if (engine === null) return [];
    if (ev.type === 'engine.registered') {
      if (ev.data.role !== 'decode') return [];
      const pool = this.pools.get(engine);
      if (!pool || pool.incarnation !== ev.data.incarnation)
        this.pools.set(engine, {
          incarnation: ev.data.incarnation,
          owner: new Map(),
          pages: new Map(),
        });
      return [];
    }
    if (ev.room === null) return [];
    if (ev.type === 'room.released') {
      const pool = this.pools.get(engine);
      for (const page of pool?.pages.get(ev.room) ?? [])
        if (pool?.owner.get(page) === ev.room) pool.owner.delete(page);
      pool?.pages.delete(ev.room);
      return [];
    }
    if (ev.type !== 'room.bootstrapped') return [];
    let pool = this.pools.get(engine);
    if (!pool) {
      pool = { incarnation: null, owner: new Map(), pages: new Map() };
      this.pools.set(engine, pool);
    }
    const found: PageConflict[] = [];
    for (const page of ev.data.pages) {
      const heldBy = pool.owner.get(page);
      if (heldBy !== undefined && heldBy !== ev.room)
        found.push({ engine, page, room: ev.room, heldBy });
      pool.owner.set(page, ev.room);
    }
    pool.pages.set(ev.room, ev.data.pages);
    this.conflicts += found.length;
    if (found.length > 0) this.lastConflict = found.at(-1) ?? null;
    return found;
  }
}
