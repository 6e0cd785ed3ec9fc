/**
 * The router: which pair of engines serves a new room (docs/design.md §12). Three policies:
 *
 * - `kv` (default): the prefill engine whose prefix cache holds the most of the request's
 *   blocks, weighed against the prefill work already queued on it. Its cost, in units of this
 *   request's prefill, is
 *
 *       (overlap weight (4) × tokens it would compute + tokens queued for prefill on it) / prompt tokens
 *
 *   where the tokens it would compute are the prompt less the leading blocks the prefix index
 *   says it holds (prefix-index.ts), and the tokens queued are those of the rooms routed to it
 *   whose KV is not posted yet, less the blocks each expected to hit. An idle engine that must
 *   compute the whole prompt costs the weight; one that holds all of it costs 0; a busy one with
 *   every block costs what its queue does, so it keeps the request until its queue is longer than
 *   the weight times the prefill the prefix saves. NVIDIA Dynamo's KV router weighs overlap against load the
 *   same way (overlap weight × blocks to prefill + active blocks).
 * - `least-loaded`: the prefill engine with the fewest live rooms (pdctl before the index).
 * - `round-robin`: prefill and decode engines in turn, whatever they hold or carry.
 *
 * Decode engines are chosen by live rooms under `kv` and `least-loaded`; the pair's transport
 * cost and the avoidance of failing links are pairs.ts's, under every policy.
 */
import type { JournalEvent } from '../../room/events.ts';
import type { EngineAppend } from '../engines/engine-appends.ts';
import type { EngineSession } from '../engines/engine-session.ts';
import { choosePair, type Pair, type PairWeights } from '../intake/pairs.ts';
import { PrefixIndex } from './prefix-index.ts';

export const ROUTER_POLICIES = ['kv', 'least-loaded', 'round-robin'] as const;
export type RouterPolicy = (typeof ROUTER_POLICIES)[number];

export interface RouterOptions {
  policy: RouterPolicy;
  /** Tokens per prefix block: the control plane's and every engine's must be equal. */
  blockTokens: number;
  /**
   * How much a token to compute weighs against a token already queued (`--router-overlap-weight`,
   * CONTROL_DEFAULTS: 4; Dynamo's is 1): above 1, a request stays with the engine holding its
   * prefix against a longer queue there (docs/benchmarks.md, "A production trace").
   */
  overlapWeight: number;
}

/** A room routed to a prefill engine, until its KV is posted. */
interface Routed {
  engine: string;
  /** Prompt tokens the engine was expected to compute (the prompt less the blocks it held). */
  tokens: number;
  /** The block names of the room's context: the only blocks its engine may report storing. */
  names: ReadonlySet<string>;
}

export class Router {
  /** Which engine holds which blocks, folded from the journal. */
  private held = new PrefixIndex();
  private turn = 0;
  private readonly routed = new Map<string, Routed>();
  private readonly queued = new Map<string, number>();

  constructor(readonly o: Readonly<RouterOptions>) {}

  /**
   * The pair for a room whose context has these block names, by the policy, among engines that
   * may take it; null when no pair can move KV.
   */
  choose(
    prefills: readonly EngineSession[],
    decodes: readonly EngineSession[],
    names: readonly string[],
    promptTokens: number,
    w: Required<Pick<PairWeights, 'avoid' | 'roomsOn'>>,
  ): Pair | null {
    switch (this.o.policy) {
      case 'round-robin': {
        const turn = this.turn++;
        const none = () => 0;
        return choosePair(rotate(prefills, turn), rotate(decodes, turn), {
          avoid: w.avoid,
          roomsOn: none,
          prefillCost: none,
        });
      }
      case 'least-loaded':
        return choosePair(prefills, decodes, w);
      case 'kv':
        return choosePair(prefills, decodes, {
          ...w,
          prefillCost: (engine) => this.cost(engine, names, promptTokens),
        });
    }
  }

  /** The `kv` policy's cost of a prefill engine for this request (see the file's comment). */
  cost(engine: string, names: readonly string[], promptTokens: number): number {
    const compute = promptTokens - this.held.overlap(engine, names) * this.o.blockTokens;
    const w = this.o.overlapWeight;
    return (w * compute + (this.queued.get(engine) ?? 0)) / Math.max(1, promptTokens);
  }

  /**
   * A room given to `engine`: it counts in the engine's queue until its KV is posted, and only
   * its own blocks may be reported stored. Returns the blocks the index says the engine holds.
   */
  admitted(room: string, engine: string, names: readonly string[], promptTokens: number): number {
    const expected = this.held.overlap(engine, names);
    const tokens = Math.max(0, promptTokens - expected * this.o.blockTokens);
    this.routed.set(room, { engine, tokens, names: new Set(names) });
    this.queued.set(engine, (this.queued.get(engine) ?? 0) + tokens);
    return expected;
  }

  /** The room is done with prefill (posted, ended, or never created). */
  forget(room: string): void {
    const r = this.routed.get(room);
    if (!r) return;
    this.routed.delete(room);
    const left = (this.queued.get(r.engine) ?? 0) - r.tokens;
    if (left > 0) this.queued.set(r.engine, left);
    else this.queued.delete(r.engine);
  }

  /** Whether `name` is a block of the room's context (false once its prefill is over). */
  isBlockOf(room: string, name: string): boolean {
    return this.routed.get(room)?.names.has(name) ?? false;
  }

  /**
   * An engine's append, before it goes to the journal: the blocks it says it stored must be
   * blocks of that room's context, from an engine whose hello announced a cache with this block
   * size, and no more than its cache holds (that each is a block name was checked at the bus).
   * Returns the event to journal (claims that fail dropped) and how many names were refused.
   */
  vet<E extends EngineAppend>(
    session: Pick<EngineSession, 'prefix'>,
    event: E,
  ): { event: E; refused: number } {
    const { room } = event;
    const data: Record<string, unknown> = event.data;
    let refused = 0;
    const out = { ...data };
    const names = (key: string, keep: (name: string) => boolean) => {
      const v = data[key];
      if (v === undefined) return;
      const list = Array.isArray(v) ? v : [];
      const kept = list.filter((n): n is string => typeof n === 'string' && keep(n));
      refused += (Array.isArray(v) ? list.length : 1) - kept.length;
      if (kept.length > 0) out[key] = kept;
      else delete out[key];
    };
    const p = session.prefix;
    const cache = p !== null && p.blockTokens === this.o.blockTokens;
    names('evictedBlocks', () => cache);
    let taken = 0;
    names(
      'storedBlocks',
      // A name that is not the room's does not use up the cache's capacity.
      (n) => cache && this.isBlockOf(room, n) && taken++ < (p?.capacityBlocks ?? 0),
    );
    // Only lists of names shortened or left out: still the event's type's data.
    return { event: { ...event, data: out } as E, refused };
  }

  /** Which engine holds which blocks, as folded so far. */
  get index(): PrefixIndex {
    return this.held;
  }

  /** The index as rebuilt at start (and after a failover): control/checkpoint. */
  restore(index: PrefixIndex): void {
    this.held = index;
  }

  /** A committed event: into the index; a posted or ended room leaves the queue. */
  fold(ev: JournalEvent, ended: boolean): void {
    this.held.fold(ev);
    if (ev.room !== null && (ended || ev.type === 'room.transfer_posted')) this.forget(ev.room);
  }
}

function rotate<T>(xs: readonly T[], by: number): T[] {
  if (xs.length === 0) return [];
  const k = by % xs.length;
  return [...xs.slice(k), ...xs.slice(0, k)];
}
