/**
 * The one writer of an engine session's `health` (registry.ts): what its heartbeats, its
 * progress and the canaries say. stalls.ts reads what is written here to decide whether the
 * engine is stalled.
 */
import type { EngineMessage } from '../../bus/protocol.ts';
import { FAILURE_BLAME, type RoomFailureReason } from '../../room/reasons.ts';
import type { EngineSession } from '../engines/engine-session.ts';
import { queuedWork } from './stalls.ts';

/** Folds a heartbeat into the engine's health. */
export function recordHeartbeat(
  s: EngineSession,
  msg: EngineMessage<'heartbeat'>,
  now: number,
): void {
  const h = s.health;
  // Events sent before the previous heartbeat and still not applied: the engine has been behind
  // since that heartbeat at the latest.
  const previous = h.lastSeen;
  h.lastSeen = now;
  h.beats++;
  if (msg.lastSeq >= h.owedSeq) h.behindSince = 0;
  else if (h.behindSince === 0) h.behindSince = previous;
  h.owedSeq = s.delivery.lastDelivered;
  // The transfer path moves if it completed something since the last heartbeat, or had nothing to do.
  if ((msg.queues.transferring ?? 0) === 0 || msg.ticks.transfer !== h.heartbeat?.ticks.transfer)
    h.transferMovedAt = now;
  const workTicked = msg.ticks.work !== h.heartbeat?.ticks.work;
  if (workTicked) h.progressAt = now;
  if (workTicked || queuedWork(s, msg.queues) === 0) h.workMovedAt = now;
  h.heartbeat = msg;
}

/** The engine showed progress: a transition of one of its rooms, or a token. */
export function recordProgress(s: EngineSession, now: number): void {
  s.health.progressAt = now;
}

/** A canary passed on the engine: its failures in a row start again from zero. */
export function recordCanaryPassed(s: EngineSession): void {
  s.health.canaryFailures = 0;
}

/** A canary failed in a stage the engine owns. */
export function recordCanaryFailed(s: EngineSession, why: string, now: number): void {
  const h = s.health;
  if (h.canaryFailures === 0) h.canaryFailingSince = now;
  h.canaryFailures++;
  h.canaryReason = why;
}

/** What a canary found: whether it passed, where it stopped, why, and its room's failure code. */
export interface CanaryVerdict {
  ok: boolean;
  stage: string | null;
  reason: string | null;
  failure: RoomFailureReason | null;
}

/**
 * A canary's verdict, for the engines its room ran on; a success clears both. A failure counts
 * against the engine that owns the stage it stopped in (bootstrap and decode: the decode engine;
 * prefill and transfer: the prefill engine) — unless its reason says whose fault it is (reasons.ts
 * `FAILURE_BLAME`): the prefill or the decode engine, or the pair, which the canary cannot place
 * and counts against neither (the outlier detector weighs those against the engines' other
 * rooms). By its stage alone, a checksum that did not match, found by the decode engine in
 * `transferred`, was the decode engine's: two corrupting prefill engines got a healthy decode
 * engine declared stalled (the simulator, --faults all seed 189). A failure nobody's engine is to
 * blame for counts against none: the journal refused writes (`journalWritable` false), or the KV
 * pool was full (`kv_pool_full`: load, not a broken engine).
 */
export function recordCanary(
  session: (engine: string) => EngineSession | undefined,
  room: { prefillEngine: string; decodeEngine: string },
  verdict: CanaryVerdict,
  journalWritable: boolean,
  now: number,
): void {
  const { ok, stage, reason } = verdict;
  if (ok) {
    for (const id of [room.prefillEngine, room.decodeEngine]) {
      const s = session(id);
      if (s) recordCanaryPassed(s);
    }
    return;
  }
  if (!journalWritable || verdict.failure === 'kv_pool_full') return;
  const blame = verdict.failure === null ? null : FAILURE_BLAME[verdict.failure].blame;
  if (blame === 'pair') return;
  const byStage =
    stage === 'prefill' || stage === 'transfer'
      ? room.prefillEngine
      : stage === 'bootstrap' || stage === 'decode'
        ? room.decodeEngine
        : null;
  const owner =
    blame === 'prefill' ? room.prefillEngine : blame === 'decode' ? room.decodeEngine : byStage;
  const s = owner === null ? undefined : session(owner);
  if (s) recordCanaryFailed(s, `${stage}: ${reason ?? 'unknown'}`, now);
}
