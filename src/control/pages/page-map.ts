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
 * without conflicts is the evidence for letting the map choose the pages itself. A control plane
 * rebuilds it at start (and so after a PostgreSQL failover) from the journal: the pages of the
 * rooms then in flight, in the pools of the decode engines' latest incarnations.
 */
import type { JournalEvent, JournalEventOf } from '../../journal/events.ts';
import type { Room } from '../../journal/reducer.ts';
import { eachEvent, type JournalReader } from '../../journal/store.ts';

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

  /**
   * The map as the journal has it up to `untilSeq` for `rooms`, the rooms in flight then (from
   * the projection): where each decode engine's pool began, then the `room.bootstrapped` of every
   * room its decode engine has not released — the only pages a room can hold — in seq order.
   */
  async rebuild(
    journal: Pick<JournalReader, 'tail'>,
    rooms: readonly Room[],
    untilSeq: number,
  ): Promise<void> {
    // Where each engine's current pool began: the first registration of its latest incarnation
    // (an engine says hello again to every new control plane, under the same incarnation).
    const began = new Map<string, JournalEventOf<'engine.registered'>>();
    await eachEvent(journal, { type: 'engine.registered' }, (ev) => {
      const seen = ev.engine === null ? undefined : began.get(ev.engine);
      if (ev.engine && ev.seq <= untilSeq && seen?.data.incarnation !== ev.data.incarnation)
        began.set(ev.engine, ev);
      return ev.seq < untilSeq;
    });
    const events: JournalEvent[] = [...began.values()];
    for (const room of rooms) {
      if (room.kvPages === null || room.releasedBy.includes(room.decodeEngine)) continue;
      const [b] = await journal.tail({ room: room.room, type: 'room.bootstrapped', limit: 1 });
      if (b && b.seq <= untilSeq) events.push(b);
    }
    for (const ev of events.sort((a, b) => a.seq - b.seq)) this.fold(ev);
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
