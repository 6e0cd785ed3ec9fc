/**
 * Which pages of each decode engine's pool are held by which live room: the control plane chooses
 * a room's decode pages here when it admits it (`reserve`), and `room.created` commits them as the
 * room's reservation, which the decode engine claims exactly (docs/critical-path.md). The rest is
 * a fold of committed events: a `room.created` reservation or a decode engine's
 * `room.bootstrapped` holds pages, that engine's `room.released` frees them, and
 * `engine.registered` with a new incarnation starts a new, empty pool.
 *
 * The map may call a page free only when the engine has freed it: an engine frees a room's pages
 * before it appends `room.released`, and the map only once that commits. A page held for two
 * rooms at once is a conflict, counted (`pdctl_page_map_conflicts_total`): none is possible while
 * that argument holds, and the decode engine refuses a reservation its pool disagrees with
 * (`kv_reservation_refused`). A control plane rebuilds the map at start (and so after a
 * PostgreSQL failover) from the journal: the pages of the rooms then in flight, in the pools of
 * the decode engines' latest incarnations.
 */

import type { JournalReader } from '../../journal/store.ts';
import type { JournalEvent, JournalEventOf } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import { PageSet } from '../../transfer/page-set.ts';

/** One conflict: a page reserved for `room` while the map held it for `heldBy`. */
export interface PageConflict {
  engine: string;
  page: number;
  room: string;
  heldBy: string;
}

/** A decode engine's pool as `reserve` needs to know it (its session). */
export interface DecodePool {
  engine: string;
  incarnation: string;
  /** Pages in its pool. */
  pages: number;
}

interface Pool {
  incarnation: string | null;
  /** The pages taken, once the pool's size is known (its registration, or its session). */
  set: PageSet | null;
  /** Room holding each page. */
  owner: Map<number, string>;
  /** Pages of each room. */
  pages: Map<string, readonly number[]>;
}

const emptyPool = (incarnation: string | null, capacity: number | undefined): Pool => ({
  incarnation,
  set: capacity === undefined ? null : new PageSet(capacity),
  owner: new Map(),
  pages: new Map(),
});

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
   * What the map holds of one engine's pool: for which incarnation, which room holds each page,
   * and each room's pages.
   */
  holdings(engine: string):
    | {
        incarnation: string | null;
        owners: ReadonlyMap<number, string>;
        pages: ReadonlyMap<string, readonly number[]>;
      }
    | undefined {
    const pool = this.pools.get(engine);
    return pool && { incarnation: pool.incarnation, owners: pool.owner, pages: pool.pages };
  }

  /**
   * Chooses `count` free pages of the engine's pool for the room (the lowest first) and holds them
   * from now on; null when the map does not know that many free (nothing is held then). A pool
   * the map has seen under another incarnation is replaced: a restarted engine has a new one.
   */
  reserve(room: string, on: DecodePool, count: number): number[] | null {
    let pool = this.pools.get(on.engine);
    if (!pool || (pool.incarnation !== null && pool.incarnation !== on.incarnation)) {
      pool = emptyPool(on.incarnation, on.pages);
      this.pools.set(on.engine, pool);
    }
    pool.incarnation = on.incarnation;
    if (!pool.set) {
      // Held before the pool's size was known (an engine registered by an older version).
      pool.set = new PageSet(on.pages);
      pool.set.takeExact([...pool.owner.keys()].filter((p) => p < on.pages));
    }
    if (pool.pages.has(room)) return null;
    const pages = pool.set.take(count);
    if (pages) this.hold(on.engine, pool, room, pages);
    return pages;
  }

  /** The room whose pages `reserve` chose was never created: they are free again. */
  unreserve(room: string, engine: string): void {
    const pool = this.pools.get(engine);
    if (pool) this.free(pool, room);
  }

  /**
   * The map as the journal has it up to `untilSeq` for `rooms`, the rooms in flight then (from
   * the projection): `pools`, the registration each engine's current pool began with (rebuilt at
   * start: control/checkpoint), then the `room.created` (its reservation) and `room.bootstrapped`
   * of every room its decode engine has not released — the only events that give a room pages —
   * in seq order.
   */
  async rebuild(
    journal: Pick<JournalReader, 'tail'>,
    rooms: readonly Room[],
    untilSeq: number,
    pools: Iterable<JournalEventOf<'engine.registered'>>,
  ): Promise<void> {
    const events: JournalEvent[] = [...pools].filter((ev) => ev.seq <= untilSeq);
    for (const room of rooms) {
      if (room.releasedBy.includes(room.decodeEngine)) continue;
      for (const type of ['room.created', 'room.bootstrapped'] as const) {
        const [e] = await journal.tail({ room: room.room, type, limit: 1 });
        if (e && e.seq <= untilSeq) events.push(e);
      }
    }
    for (const ev of events.sort((a, b) => a.seq - b.seq)) this.fold(ev);
  }

  /** Folds one committed event (others are ignored); returns the conflicts it found. */
  fold(ev: JournalEvent): PageConflict[] {
    if (ev.type === 'engine.registered') {
      if (ev.engine === null || ev.data.role !== 'decode') return [];
      const pool = this.pools.get(ev.engine);
      if (!pool || pool.incarnation !== ev.data.incarnation)
        this.pools.set(ev.engine, emptyPool(ev.data.incarnation, ev.data.pages));
      return [];
    }
    if (ev.room === null) return [];
    if (ev.type === 'room.created') {
      const r = ev.data.reservation?.decode;
      const pool = this.pools.get(ev.data.decodeEngine);
      // A reservation in a pool that has since been replaced holds nothing in the new one.
      if (!r || !pool || (pool.incarnation !== null && pool.incarnation !== r.incarnation))
        return [];
      return this.claim(ev.data.decodeEngine, pool, ev.room, r.pages);
    }
    if (ev.engine === null) return [];
    if (ev.type === 'room.released') {
      const pool = this.pools.get(ev.engine);
      if (pool) this.free(pool, ev.room);
      return [];
    }
    if (ev.type !== 'room.bootstrapped') return [];
    let pool = this.pools.get(ev.engine);
    if (!pool) {
      pool = emptyPool(null, undefined);
      this.pools.set(ev.engine, pool);
    }
    return this.claim(ev.engine, pool, ev.room, ev.data.pages);
  }

  /** The room holds these pages from now on (the same as it holds: nothing changes). */
  private claim(
    engine: string,
    pool: Pool,
    room: string,
    pages: readonly number[],
  ): PageConflict[] {
    const had = pool.pages.get(room);
    if (had && had.length === pages.length && had.every((p, i) => p === pages[i])) return [];
    if (had) this.free(pool, room);
    const found = this.hold(engine, pool, room, pages);
    this.conflicts += found.length;
    if (found.length > 0) this.lastConflict = found.at(-1) ?? null;
    return found;
  }

  private hold(engine: string, pool: Pool, room: string, pages: readonly number[]): PageConflict[] {
    const found: PageConflict[] = [];
    for (const page of pages) {
      const heldBy = pool.owner.get(page);
      if (heldBy !== undefined && heldBy !== room) found.push({ engine, page, room, heldBy });
      else if (pool.set && page < pool.set.capacity && !pool.set.has(page))
        pool.set.takeExact([page]);
      pool.owner.set(page, room);
    }
    pool.pages.set(room, pages);
    return found;
  }

  private free(pool: Pool, room: string): void {
    // Only the pages still the room's (one held since for another room is a conflict's, kept).
    const own = (pool.pages.get(room) ?? []).filter((page) => pool.owner.get(page) === room);
    for (const page of own) pool.owner.delete(page);
    pool.set?.give(own);
    pool.pages.delete(room);
  }
}
