/**
 * One engine as everything outside the control plane sees it — the API, `/health/ready`, `/ui`,
 * metrics, the escalation ladder and the drills: a frozen snapshot, and one status over it from
 * one liveness policy, so that whether an engine is alive has one answer everywhere.
 *
 *   connecting  its hello is admitted, its replay not yet done (or its process is gone)
 *   live        heartbeating within `staleAfterMs`, taking new rooms
 *   draining    heartbeating, but finishing its rooms and taking no new ones
 *   stale       no heartbeat for `staleAfterMs`: no new rooms, not counted ready
 *   stalled     no heartbeat for `stalledAfterMs`, or a stall found (stalls.ts): the ladder acts
 *
 * New rooms go to engines whose status by heartbeat alone is `live` (`takesRooms`): one with a
 * stall found but still heartbeating keeps getting rooms until the ladder resets it — leaving it
 * out would also starve the canary whose passing clears a canary stall, and without the ladder
 * (`--no-restart-stalled`) nothing else would. `/health/ready` counts the same engines as
 * capacity, and turns red on the stall in its own check.
 */
import type { EngineMessage } from '../../bus/protocol.ts';
import type { Cordon } from '../evidence/cordons.ts';
import type { Ejection } from '../evidence/ejections.ts';
import type { Stall } from '../evidence/stalls.ts';
import type { EngineIdentity, EngineSession } from './engine-session.ts';

export type EngineStatus = 'connecting' | 'live' | 'draining' | 'stale' | 'stalled';
export const ENGINE_STATUSES: readonly EngineStatus[] = [
  'connecting',
  'live',
  'draining',
  'stale',
  'stalled',
];

/** When an engine counts as alive. Heartbeats come every 250 ms (bus/protocol.ts HEARTBEAT_MS). */
export interface LivenessPolicy {
  /** A heartbeat older than this: the engine gets no new room and readiness does not count it. */
  staleAfterMs: number;
  /** Older than this, from a process still there: stalled, and the ladder acts (fences or restarts). */
  stalledAfterMs: number;
}

export const DEFAULT_LIVENESS: Readonly<LivenessPolicy> = Object.freeze({
  staleAfterMs: 3000,
  stalledAfterMs: 5000,
});

/** An engine as the control plane knows it now; never changes (a new one is made per call). */
export interface EngineView
  extends Omit<EngineIdentity, 'peer' | 'key'>,
    Readonly<{
      status: EngineStatus;
      /**
       * Whether new rooms go to it: live by its heartbeat (`engineStatus` without the stall), and
       * neither cordoned, ejected nor being retired.
       */
      takesRooms: boolean;
      /** Why it takes no new rooms until uncordoned (cordons.ts); null when it is not cordoned. */
      cordon: Cordon | null;
      /** Why it is out of rotation as an outlier (ejections.ts); null when it is not. */
      ejection: Ejection | null;
      /** Why it is stalled (a stall of stalls.ts, or its heartbeat), when it is. */
      stall: Omit<Stall, 'engine'> | null;
      /** This hello's session number: a reset in place opens a new one. */
      session: number;
      /** Heartbeats received in this session. */
      beats: number;
      /** When its last heartbeat (or hello) arrived. */
      lastSeen: number;
      heartbeat: Readonly<EngineMessage<'heartbeat'>> | null;
      /** Rooms not yet ended on it (room-book.ts). */
      liveRooms: number;
      /** KV pages promised to its rooms (pages/page-ledger.ts). */
      reservedPages: number;
      canaryFailures: number;
    }> {}

/**
 * The one rule: connecting until its replay is done; stalled when a stall was found or its
 * heartbeat is older than `stalledAfterMs`; stale past `staleAfterMs`; draining when it says so;
 * live otherwise.
 */
export function engineStatus(
  s: Pick<EngineSession, 'delivery' | 'health'>,
  policy: Readonly<LivenessPolicy>,
  now: number,
  stall: Omit<Stall, 'engine'> | null = null,
): EngineStatus {
  if (!s.delivery.live) return 'connecting';
  const age = now - s.health.lastSeen;
  if (stall || age > policy.stalledAfterMs) return 'stalled';
  if (age > policy.staleAfterMs) return 'stale';
  return s.health.heartbeat?.state === 'draining' ? 'draining' : 'live';
}

/**
 * A heartbeat older than `stalledAfterMs`, from an engine past its replay, is itself a stall.
 * `heardSince`: when this process was last able to hear (the ladder's: a process that was paused
 * heard nothing, and no engine is to blame for it); silence counts from the later of the two.
 */
export function heartbeatStall(
  e: { connected: boolean; lastSeen: number },
  policy: Readonly<LivenessPolicy>,
  now: number,
  heardSince = 0,
): Omit<Stall, 'engine'> | null {
  const silentMs = now - Math.max(e.lastSeen, heardSince);
  if (!e.connected || !(silentMs > policy.stalledAfterMs)) return null;
  return {
    kind: 'heartbeat',
    reason: `no heartbeat for ${now - e.lastSeen} ms`,
    since: e.lastSeen,
  };
}

/** The frozen views of the registry's sessions, with the stalls found now and its cordons. */
export function viewsOf(
  registry: {
    all(): EngineSession[];
    cordons: { of(engine: string): Cordon | null };
    ejections: { of(engine: string): Ejection | null };
    retiring: ReadonlySet<string>;
  },
  liveOn: (engine: string) => number,
  policy: Readonly<LivenessPolicy>,
  now: number,
  stalls: readonly Stall[],
): EngineView[] {
  return registry.all().map((s) => {
    const found = stalls.find((x) => x.engine === s.engine) ?? null;
    const out = {
      cordon: registry.cordons.of(s.engine),
      ejection: registry.ejections.of(s.engine),
    };
    return viewOf(s, liveOn(s.engine), policy, now, found, out, registry.retiring.has(s.engine));
  });
}

/** The frozen view of one session. */
export function viewOf(
  s: EngineSession,
  liveRooms: number,
  policy: Readonly<LivenessPolicy>,
  now: number,
  found: Omit<Stall, 'engine'> | null,
  out: { cordon: Cordon | null; ejection: Ejection | null } = { cordon: null, ejection: null },
  retiring = false,
): EngineView {
  const stall =
    found ??
    heartbeatStall({ connected: s.delivery.live, lastSeen: s.health.lastSeen }, policy, now);
  const { delivery, health, load, peer: _peer, key: _key, ...identity } = s;
  return Object.freeze({
    ...identity,
    status: engineStatus(s, policy, now, stall),
    takesRooms:
      !retiring && !out.cordon && !out.ejection && engineStatus(s, policy, now) === 'live',
    ...out,
    stall,
    session: delivery.session,
    beats: health.beats,
    lastSeen: health.lastSeen,
    heartbeat: health.heartbeat,
    liveRooms,
    reservedPages: load.reservedPages,
    canaryFailures: health.canaryFailures,
  });
}
