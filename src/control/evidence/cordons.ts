/**
 * Cordoned engines: those that take no new rooms until an operator says otherwise. The escalation
 * ladder cordons an engine whose own fault a restart did not cure, instead of restarting every
 * engine (docs/design.md §9): its rooms in flight move to healthy pairs, the incarnation is fenced
 * (it exits when next heard from, and is started again by its supervisor), and the engine id stays
 * cordoned across incarnations — registered and visible, for inspection, but given no room — until
 * `pdctl engines uncordon ID`. An operator's cordon (`pdctl engines cordon ID`) fences nothing:
 * the engine's rooms finish there, and its process is left as it is. Both ends are journaled (`engine.cordoned`, `engine.uncordoned`),
 * and a control plane rebuilds the set from them at start (so also after a failover), from its
 * state checkpoint and the events after it (control/checkpoint).
 */

import type { JournalLog } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import { type Clock, systemClock } from '../../ports/clock.ts';
import type { JournalEventOf } from '../../room/events.ts';

/** Why and since when an engine is cordoned. */
export interface Cordon {
  reason: string;
  /** `ladder` or `operator`. */
  by: string;
  evidence: string | null;
  /** When it was cordoned (unix ms). */
  at: number;
}

/** What cordoning needs: where it is journaled and logged, and of the control plane. */
export interface CordonDeps {
  journal: Pick<JournalLog, 'append'>;
  log: Logger;
  control: {
    /** The rooms: how many are live on the engine now. */
    book: { liveOn(engine: string): number };
    /** Moves the incarnation's rooms and refuses it from now on; false when it is not registered. */
    fence(engine: string, incarnation: string, reason: string): boolean;
  };
}

/**
 * The cordoned engines (the registry holds the set: an engine in it is no candidate for a room).
 * Changed only by `cordon` and `uncordon` below, and restored at start.
 */
export class Cordons {
  private readonly byEngine = new Map<string, Cordon>();

  constructor(private readonly clock: Clock = systemClock) {}

  /** Why the engine is cordoned; null when it is not. */
  of(engine: string): Cordon | null {
    return this.byEngine.get(engine) ?? null;
  }

  has(engine: string): boolean {
    return this.byEngine.has(engine);
  }

  /** Every cordoned engine, by id. */
  all(): ReadonlyMap<string, Cordon> {
    return this.byEngine;
  }

  /**
   * Cordons the engine: no new room from now on, its rooms in flight moved and `incarnation`
   * fenced (null: none registered), journaled `engine.cordoned`. False when it already was.
   */
  async cordon(
    deps: CordonDeps,
    engine: string,
    incarnation: string | null,
    reason: string,
    by: 'ladder' | 'operator',
    evidence: string | null = null,
  ): Promise<boolean> {
    if (this.byEngine.has(engine)) return false;
    const rooms = deps.control.book.liveOn(engine);
    this.byEngine.set(engine, { reason, by, evidence, at: this.clock.now() });
    deps.log.error(
      { engine, reason, by, evidence, rooms },
      'engine cordoned: it takes no new rooms and its rooms move; `pdctl engines uncordon` brings it back',
    );
    if (incarnation !== null) deps.control.fence(engine, incarnation, `cordoned: ${reason}`);
    await deps.journal.append({
      type: 'engine.cordoned',
      engine,
      source: by === 'ladder' ? 'watchdog' : 'api',
      data: { reason, by, rooms, ...(evidence ? { evidence } : {}) },
    });
    return true;
  }

  /** Takes the engine back (journaled `engine.uncordoned`); false when it was not cordoned. */
  async uncordon(deps: CordonDeps, engine: string, reason: string): Promise<boolean> {
    if (!this.byEngine.delete(engine)) return false;
    deps.log.warn({ engine, reason }, 'engine uncordoned: it takes new rooms again');
    await deps.journal.append({
      type: 'engine.uncordoned',
      engine,
      source: 'api',
      data: { reason, by: 'operator' },
    });
    return true;
  }

  /** The set as rebuilt at start (control/checkpoint). */
  restore(byEngine: ReadonlyMap<string, Cordon>): void {
    this.byEngine.clear();
    for (const [engine, c] of byEngine) this.byEngine.set(engine, c);
  }
}

/** Folds a committed `engine.cordoned` or `engine.uncordoned` into a set of cordons. */
export function foldCordon(
  byEngine: Map<string, Cordon>,
  ev: JournalEventOf<'engine.cordoned' | 'engine.uncordoned'>,
): void {
  if (ev.engine === null) return;
  if (ev.type === 'engine.uncordoned') {
    byEngine.delete(ev.engine);
    return;
  }
  const d = ev.data;
  byEngine.set(ev.engine, { reason: d.reason, by: d.by, evidence: d.evidence ?? null, at: ev.ts });
}
