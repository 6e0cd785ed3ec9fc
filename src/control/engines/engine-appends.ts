/**
 * What an engine may append, checked once where its `append` comes off the bus: the room events
 * of its role (docs/protocol.md), each with its type's data. Past `checkAppend` an append is an
 * `EngineAppend` — typed by its `type` — so nothing downstream casts an engine's data.
 */
import type { EngineMessage } from '../../bus/protocol.ts';
import { dataError, type EventData } from '../../room/events.ts';
import { FAILURE_REASONS, FAILURE_REPORTERS, isFailureReason } from '../../room/reasons.ts';

/** The room events each role sends; anything else from it is refused. */
export const ENGINE_APPENDS = {
  prefill: [
    'room.prefill_started',
    'room.transfer_posted',
    'room.transfer_completed',
    'room.failed',
    'room.released',
  ],
  decode: [
    'room.bootstrap_started',
    'room.bootstrapped',
    'room.decode_started',
    'room.completed',
    'room.failed',
    'room.released',
  ],
} as const;

export type AppendingRole = keyof typeof ENGINE_APPENDS;
export type EngineAppendType = (typeof ENGINE_APPENDS)[AppendingRole][number];

/** An engine's append as validated: its type's data, for a room it names. */
export type EngineAppend = {
  [T in EngineAppendType]: {
    type: T;
    room: string;
    data: EventData<T>;
    /** See the `append` message: the seq whose arrival started the work it reports. */
    cause?: number;
  };
}[EngineAppendType];

export type CheckedAppend =
  | { ok: true; event: EngineAppend }
  /**
   * `not_owner`: a type its role never sends, or a failure its role cannot detect (`claim`: that
   * failure reason); `bad_payload`: the type's data is not right.
   */
  | { ok: false; reason: 'not_owner' | 'bad_payload'; message: string; claim?: string };

/** The failure reasons an engine of `role` may report. */
export function reportable(role: AppendingRole): string[] {
  return FAILURE_REASONS.filter((r) => FAILURE_REPORTERS[r].includes(role));
}

/** Whether an engine of `role` may append `event` as it is. */
export function checkAppend(
  role: AppendingRole,
  event: EngineMessage<'append'>['event'],
): CheckedAppend {
  const { type, data } = event;
  if (!(ENGINE_APPENDS[role] as readonly string[]).includes(type))
    return { ok: false, reason: 'not_owner', message: `a ${role} engine may not append ${type}` };
  const wrong = dataError(type as EngineAppendType, data);
  if (wrong !== null) return { ok: false, reason: 'bad_payload', message: `${type}: ${wrong}` };
  if (type === 'room.failed') {
    // An engine reports only failures it can see; a reason of a newer pdctl passes as text.
    const reason = (data as EventData<'room.failed'>).reason;
    if (isFailureReason(reason) && !FAILURE_REPORTERS[reason].includes(role))
      return {
        ok: false,
        reason: 'not_owner',
        claim: reason,
        message: `a ${role} engine cannot detect ${reason}; it may fail a room for ${reportable(role).join(', ')}`,
      };
  }
  // The schema check above is what makes the data this type's: the one place it is asserted.
  return { ok: true, event: event as EngineAppend };
}
