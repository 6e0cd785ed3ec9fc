/**
 * Which prefill and decode engine serve a new room: the pair of lowest cost among the engines
 * that may take it, where a pair's cost is its prefill engine's (the router's, routing/router.ts;
 * its live rooms by default), its decode engine's live rooms, and what moving its KV costs.
 * Engines on one host move KV through shared memory (or CUDA IPC); engines on two hosts move it
 * over UCX, which costs `PAIR_COSTS.ucxRooms` more, and only when the prefill engine sends over
 * UCX and the decode engine receives over it. A pair that cannot move KV at all is never chosen,
 * and one whose last transfer failed (a cut link between two hosts) is passed over for a while
 * when another pair can take the room (PairHealth).
 */

import type { JournalEvent, KvTransport } from '../../room/events.ts';
import { FAILURE_BLAME, isFailureReason, TRANSFER_FAILURES } from '../../room/reasons.ts';
import type { Room } from '../../room/reducer.ts';
import { isTerminal } from '../../room/states.ts';
import { hostTag } from '../../transfer/host.ts';
import type { EngineIdentity, EngineSession } from '../engines/engine-session.ts';

/** How a pair's KV moves: shared memory, CUDA IPC (one host), or UCX (any two hosts). */
export type PairTransport = KvTransport;

/**
 * The price of a transport in live rooms. A UCX pair is chosen over a same-host pair only when
 * the same-host pair carries more than this many live rooms more: over TCP a page takes several
 * times as long as a shared-memory copy (docs/design.md §11), but an idle host should not sit idle
 * while another queues.
 */
export const PAIR_COSTS: Readonly<Record<PairTransport, number>> = Object.freeze({
  shm: 0,
  cuda: 0,
  ucx: 2,
});

/** Engines whose `host` is equal share shared memory; an engine that did not say is taken for any host. */
export function sameHost(a: EngineIdentity, b: EngineIdentity): boolean {
  return a.host === null || b.host === null || a.host === b.host;
}

/**
 * How the prefill engine would move KV into the decode engine's pool, by the same rule the prefill
 * engine applies (prefill.ts `destination`); null when it cannot (another host without UCX on
 * both ends, or a sender held to shared memory).
 */
export function transportBetween(
  prefill: EngineIdentity,
  decode: EngineIdentity,
): PairTransport | null {
  const local = prefill.kvDevice !== null || decode.kvDevice !== null ? 'cuda' : 'shm';
  switch (prefill.kvSend) {
    case 'shm':
      return sameHost(prefill, decode) ? local : null;
    case 'ucx':
      return decode.kvRemote ? 'ucx' : null;
    default:
      if (sameHost(prefill, decode)) return local;
      return decode.kvRemote ? 'ucx' : null;
  }
}

export interface Pair {
  prefill: EngineSession;
  decode: EngineSession;
  transport: PairTransport;
}

/** How `choosePair` weighs pairs. */
export interface PairWeights {
  /** Pairs whose KV could not move lately (`PairHealth.avoid`): taken only when no other can. */
  avoid?: (prefill: string, decode: string) => boolean;
  /** Rooms not yet ended on an engine (room-book.ts `liveOn`): its load. */
  roomsOn?: (engine: string) => number;
  /** A prefill engine's cost (routing/router.ts); default its `roomsOn`. */
  prefillCost?: (engine: string) => number;
  costs?: Readonly<Record<PairTransport, number>>;
}

/**
 * The pair of lowest cost (the prefill engine's cost, rooms on the decode engine, and the
 * transport's cost); of equal ones, the
 * cheaper transport, then the first found. Pairs that `avoid` names are taken only when no other
 * pair can move KV (so a healed link is tried again).
 */
export function choosePair(
  prefills: readonly EngineSession[],
  decodes: readonly EngineSession[],
  w: PairWeights = {},
): Pair | null {
  const avoid = w.avoid ?? (() => false);
  const roomsOn = w.roomsOn ?? (() => 0);
  const prefillCost = w.prefillCost ?? roomsOn;
  const costs = w.costs ?? PAIR_COSTS;
  const weigh = { costs, roomsOn, prefillCost };
  return (
    cheapest(prefills, decodes, weigh, (p, d) => !avoid(p, d)) ??
    cheapest(prefills, decodes, weigh, () => true)
  );
}

function cheapest(
  prefills: readonly EngineSession[],
  decodes: readonly EngineSession[],
  w: {
    costs: Readonly<Record<PairTransport, number>>;
    roomsOn: (engine: string) => number;
    prefillCost: (engine: string) => number;
  },
  allowed: (prefill: string, decode: string) => boolean,
): Pair | null {
  const { costs, roomsOn } = w;
  const prefillCosts = new Map(prefills.map((p) => [p.engine, w.prefillCost(p.engine)]));
  let best: Pair | null = null;
  let bestCost = Number.POSITIVE_INFINITY;
  for (const prefill of prefills) {
    for (const decode of decodes) {
      const transport = transportBetween(prefill, decode);
      if (transport === null || !allowed(prefill.engine, decode.engine)) continue;
      const cost =
        (prefillCosts.get(prefill.engine) as number) + roomsOn(decode.engine) + costs[transport];
      if (
        cost < bestCost ||
        (cost === bestCost && best && costs[transport] < costs[best.transport])
      ) {
        best = { prefill, decode, transport };
        bestCost = cost;
      }
    }
  }
  return best;
}

/** Why no pair of these engines can move KV: for the refusal's message. */
export function unreachable(
  prefills: readonly EngineSession[],
  decodes: readonly EngineSession[],
): string {
  const hosts = (xs: readonly EngineSession[]) =>
    [...new Set(xs.map((s) => `${s.engine}@${s.host === null ? '?' : hostTag(s.host)}`))].join(
      ', ',
    );
  return `no prefill engine can move KV to a decode engine that has room: prefill ${hosts(prefills)}; decode ${hosts(decodes)} (engines on different hosts need UCX on both ends: --kv-transport auto or ucx, and a decode engine that receives over UCX)`;
}

/** A pair being avoided: until when, its current pause, and the room probing it after the pause. */
interface FailingPair {
  until: number;
  backoffMs: number;
  probe: { room: string; since: number } | null;
}

/**
 * Pairs whose KV could not move lately: a transfer between them failed or stalled (a cut link
 * between their hosts, a peer that does not take puts). Such a pair is avoided for `baseMs`. Once
 * that pause is over, one room probes it (`taken`) while the others keep away, as a breaker half
 * open: its transfer completing clears the pair, a transfer failing again doubles the pause (up
 * to `maxMs`), and the probe ending any other way lets the next room probe. Kept by engine id, so
 * a restarted engine inherits its pairs' record.
 */
export class PairHealth {
  private readonly failing = new Map<string, FailingPair>();

  constructor(
    private readonly baseMs: number,
    private readonly maxMs: number,
  ) {}

  /** A transfer between them failed: avoided from now, longer if it failed again after a pause. */
  failed(prefill: string, decode: string, now: number): void {
    const key = pairKey(prefill, decode);
    const prev = this.failing.get(key);
    // Rooms caught by one cut fail together: the pause they started is not extended by each.
    if (prev && now < prev.until) return;
    const backoffMs = prev ? Math.min(this.maxMs, prev.backoffMs * 2) : this.baseMs;
    this.failing.set(key, { until: now + backoffMs, backoffMs, probe: null });
  }

  /** A new room was placed on the pair: after a pause, the first is its probe. */
  taken(prefill: string, decode: string, room: string, now: number): void {
    const f = this.failing.get(pairKey(prefill, decode));
    if (f && now >= f.until && !this.probing(f, now)) f.probe = { room, since: now };
  }

  /** Reads a committed event of the room: a transfer that completed or a pair's failure. */
  fold(room: Room, ev: JournalEvent): void {
    if (ev.type === 'room.transfer_completed') this.moved(room.prefillEngine, room.decodeEngine);
    else if (ev.type === 'room.failed' && isPairFailure(room.reason))
      this.failed(room.prefillEngine, room.decodeEngine, ev.ts);
    if (this.failing.size === 0) return;
    // A probe that ended without a verdict on its pair (aborted, failed otherwise, moved away)
    // leaves the pair to the next room.
    const key = pairKey(room.prefillEngine, room.decodeEngine);
    for (const [k, f] of this.failing)
      if (f.probe?.room === room.room && (k !== key || isTerminal(room.state))) f.probe = null;
  }

  moved(prefill: string, decode: string): void {
    this.failing.delete(pairKey(prefill, decode));
  }

  avoid(prefill: string, decode: string, now: number): boolean {
    const f = this.failing.get(pairKey(prefill, decode));
    return f !== undefined && (now < f.until || this.probing(f, now));
  }

  /** A probe is out; one whose room never reported (its creation lost) lapses after `maxMs`. */
  private probing(f: FailingPair, now: number): boolean {
    return f.probe !== null && now < f.probe.since + this.maxMs;
  }
}

const pairKey = (prefill: string, decode: string) => `${prefill}\u0000${decode}`;

/**
 * Room failures that say the pair could not move KV right: its link could not move it
 * (journal/reasons.ts `TRANSFER_FAILURES`), or what arrived was wrong (`FAILURE_BLAME` `pair`: a
 * checksum mismatch, an image the model cannot load). The pair is passed over for a while
 * (PairHealth); which engine of it is the outlier, recovery/outliers.ts finds.
 */
export function isPairFailure(reason: string | null): boolean {
  return (
    isFailureReason(reason) &&
    (TRANSFER_FAILURES[reason]?.link === true || FAILURE_BLAME[reason].blame === 'pair')
  );
}
