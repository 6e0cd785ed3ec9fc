/**
 * When an engine counts as stalled: the watchdog inputs of docs/design.md §9, read from what the
 * control plane already has — each engine's heartbeats (tick counters and queue depths), the
 * rooms it folds from the journal, the tokens streamed to it, and the canary's verdicts. Pure:
 * the escalation ladder acts on what this finds, and `/health/ready` shows it.
 */
import type { Room } from '../../room/reducer.ts';
import type { RoomState } from '../../room/states.ts';
import type { EngineSession } from '../engines/engine-session.ts';

/** Which detector saw it: a relapse of the same kind is escalated faster by the ladder. */
export type StallKind = 'bus' | 'transfer' | 'work' | 'pile_up' | 'canary' | 'heartbeat';

export interface Stall {
  engine: string;
  kind: StallKind;
  reason: string;
  /** When the problem began, as far as it can be told (unix ms). */
  since: number;
}

export interface StallPolicy {
  /**
   * An engine whose bus loop applied none of the events sent to it before its previous heartbeat,
   * for this long: a bus loop applies an event in well under a millisecond, so half a second
   * behind is a wedged loop (the incident), not a busy one. Default 500 ms.
   */
  busFrozenMs: number;
  /** An engine whose transfers in flight completed nothing for this long. Default 1000 ms. */
  frozenMs: number;
  /** Rooms queued for its work loop (prefill slices, decode passes), the loop's tick still. Default 3000 ms. */
  workFrozenMs: number;
  /**
   * Rooms waiting on it in one state and nothing of it moving — no transition of its rooms, no
   * token, no work tick — for this long. Default 5000 ms.
   */
  pileUpMs: number;
  /** This many canaries in a row failing in a stage it owns. Default 3. */
  canaryFailures: number;
}

export const DEFAULT_STALL_POLICY: Readonly<StallPolicy> = Object.freeze({
  busFrozenMs: 500,
  frozenMs: 1000,
  workFrozenMs: 3000,
  pileUpMs: 5000,
  canaryFailures: 3,
});

/** The states in which a room waits on each role's engine to move it. */
export const AWAITS: Readonly<Record<'prefill' | 'decode', readonly RoomState[]>> = {
  prefill: ['waiting_for_input', 'prefilling'],
  decode: ['created', 'bootstrapping', 'transferred'],
};

/**
 * Work an engine's heartbeat says is queued for its work loop: prefill rooms waiting or in compute
 * (an active room whose transfer is in flight is the transfer core's), decode rooms running.
 */
export function queuedWork(s: Pick<EngineSession, 'role'>, queues: Record<string, number>): number {
  return s.role === 'prefill'
    ? (queues.waiting ?? 0) + Math.max(0, (queues.active ?? 0) - (queues.transferring ?? 0))
    : (queues.decoding ?? 0);
}

/** What the detectors know of the control plane itself. */
export interface ControlSide {
  /** False: the work and pile-up detectors hold back — an engine waiting on the journal is not stuck. */
  journalWritable: boolean;
  /**
   * The last time the control plane's own loop was blocked (loop-lag.ts), unix ms: what it heard
   * of an engine before then may have been heard late, so no window of evidence starts earlier.
   */
  lateAt: number;
}

/** The stalled engines now, one finding each (the first detector that fires, in the order below). */
export function findStalls(
  sessions: readonly EngineSession[],
  rooms: Iterable<Room>,
  policy: StallPolicy,
  now: number,
  control: ControlSide = { journalWritable: true, lateAt: 0 },
): Stall[] {
  const waiting = waitingRooms(rooms);
  const out: Stall[] = [];
  for (const s of sessions) {
    if (!s.delivery.live) continue;
    const found = stallOf(s, waiting.get(s.engine), policy, now, control);
    if (found) out.push({ engine: s.engine, ...found });
  }
  return out;
}

function stallOf(
  s: EngineSession,
  waiting: Map<RoomState, { count: number; oldest: number }> | undefined,
  policy: StallPolicy,
  now: number,
  control: ControlSide,
): Omit<Stall, 'engine'> | null {
  const from = (t: number) => Math.max(t, control.lateAt);
  const behindSince = s.health.behindSince > 0 ? from(s.health.behindSince) : 0;
  if (behindSince > 0 && now - behindSince > policy.busFrozenMs)
    return {
      kind: 'bus',
      reason: `bus loop applied nothing for ${now - behindSince} ms after being sent events`,
      since: behindSince,
    };
  const transfers = s.health.heartbeat?.queues.transferring ?? 0;
  const transferMovedAt = from(s.health.transferMovedAt);
  if (transfers > 0 && now - transferMovedAt > policy.frozenMs)
    return {
      kind: 'transfer',
      reason: `transfer core completed nothing for ${now - transferMovedAt} ms with ${transfers} transfers in flight`,
      since: transferMovedAt,
    };
  if (control.journalWritable) {
    const work = s.health.heartbeat ? queuedWork(s, s.health.heartbeat.queues) : 0;
    const workMovedAt = from(s.health.workMovedAt);
    if (work > 0 && now - workMovedAt > policy.workFrozenMs)
      return {
        kind: 'work',
        reason: `work loop did nothing for ${now - workMovedAt} ms with ${work} rooms queued`,
        since: workMovedAt,
      };
    for (const [state, w] of waiting ?? []) {
      if (!AWAITS[s.role].includes(state)) continue;
      const since = from(Math.max(w.oldest, s.health.progressAt));
      if (now - since > policy.pileUpMs)
        return {
          kind: 'pile_up',
          reason: `${w.count} rooms waiting on it in ${state}, and none of its rooms moved for ${now - since} ms`,
          since,
        };
    }
  }
  if (s.health.canaryFailures >= policy.canaryFailures)
    return {
      kind: 'canary',
      reason: `${s.health.canaryFailures} canaries in a row failed on it: ${s.health.canaryReason}`,
      since: s.health.canaryFailingSince,
    };
  return null;
}

/** Live rooms by the engine they wait on and their state: how many, and since when the oldest. */
function waitingRooms(
  rooms: Iterable<Room>,
): Map<string, Map<RoomState, { count: number; oldest: number }>> {
  const out = new Map<string, Map<RoomState, { count: number; oldest: number }>>();
  for (const r of rooms) {
    const engine = AWAITS.prefill.includes(r.state)
      ? r.prefillEngine
      : AWAITS.decode.includes(r.state)
        ? r.decodeEngine
        : null;
    if (engine === null) continue;
    let byState = out.get(engine);
    if (!byState) {
      byState = new Map();
      out.set(engine, byState);
    }
    const w = byState.get(r.state);
    if (w) {
      w.count++;
      w.oldest = Math.min(w.oldest, r.stateSince);
    } else byState.set(r.state, { count: 1, oldest: r.stateSince });
  }
  return out;
}
