/**
 * What becomes of a room when its engine is lost, and of a room that failed before its first
 * token — decided apart from done (issue 41): pure functions of the room as folded, what its
 * client's stream has had, and its request. migration.ts does what they say (journals, moves the
 * stream, finds the pair); their tests are given/when/then on data (loss.unit.test.ts).
 */
import { maxRequestTextBytes, type RoomRequest, requestTextBytes } from '../../bus/protocol.ts';
import { FAILURE_BLAME, isFailureReason, type RoomFailureReason } from '../../room/reasons.ts';
import type { Room } from '../../room/reducer.ts';
import { isTerminal } from '../../room/states.ts';
import type { RoomStream } from '../intake/streams.ts';

/** What the decisions read of a client's stream. */
export type StreamFacts = Pick<
  RoomStream,
  | 'done'
  | 'cancelled'
  | 'text'
  | 'tokens'
  | 'migrations'
  | 'retries'
  | 'currentTokens'
  | 'decodedTokens'
  | 'currentIds'
>;

export type LossDecision =
  /** It ended: the lost engine's release is journaled for it. */
  | { kind: 'release' }
  /** Nothing to continue (no client reads it, it is being aborted, migration is off): its deadline ends it. */
  | { kind: 'leave' }
  /** It cannot go on elsewhere: failed now. */
  | {
      kind: 'fail';
      reason: 'too_large_to_migrate' | 'generated_tokens_unknown' | 'migration_limit_reached';
    }
  /** It goes on as a new room with `next`, its stream unbroken. */
  | { kind: 'migrate'; next: RoomRequest };

/** One live (or just ended) room of a lost engine. `limit`: migrations per request, 0 = off. */
export function decideLoss(
  r: Room,
  stream: StreamFacts | undefined,
  request: RoomRequest | undefined,
  limit: number,
): LossDecision {
  if (isTerminal(r.state)) return { kind: 'release' };
  if (limit === 0 || !stream || stream.done || !request || r.abortRequestedAt !== null)
    return { kind: 'leave' };
  // The prompt plus what was streamed so far must fit in the new room's room.created event,
  // and a model that is sent token ids needs every generated one.
  const next = continuation(request, stream);
  if (requestTextBytes(next) > maxRequestTextBytes())
    return { kind: 'fail', reason: 'too_large_to_migrate' };
  if (next.tokens !== undefined && stream.currentIds.length !== stream.currentTokens)
    return { kind: 'fail', reason: 'generated_tokens_unknown' };
  if (stream.migrations >= limit) return { kind: 'fail', reason: 'migration_limit_reached' };
  return { kind: 'migrate', next };
}

/** States of a room whose prefill has not begun: it waits in its prefill engine's queue. */
const QUEUED: ReadonlySet<string> = new Set(['created', 'bootstrapping', 'waiting_for_input']);

/**
 * A live room of an engine being retired (a change of role, a scale-down): the request it goes
 * on with on a pair without that engine, or null where it stays to finish there. Only a room
 * whose prefill has not begun moves — nothing has been computed for it, so moving costs nothing
 * but its place in the queue — and only where it could move after a loss. It never fails: what
 * cannot move finishes where it is, as the drain lets it.
 */
export function decideRetiring(
  r: Room,
  stream: StreamFacts | undefined,
  request: RoomRequest | undefined,
  limit: number,
): RoomRequest | null {
  if (!QUEUED.has(r.state)) return null;
  const decided = decideLoss(r, stream, request, limit);
  return decided.kind === 'migrate' ? decided.next : null;
}

/**
 * A room that failed before its decode engine streamed a token to its client — a request's first
 * room, or the room a migration continued it in: its failure's reason, whom to leave out of the
 * pair it is tried again on, in order of preference, and the request it is tried again with (the
 * same one; after the first token its prefill engine streamed, the continuation from it, as a
 * migration's) — null when it is not tried again (the reason is one another pair would share, the
 * room's decode engine had streamed a token, the client left, retries are spent, it was aborted,
 * it was a canary, which probes its engines and would hide what it found elsewhere, or the
 * continuation could not be made).
 */
export function decideRetry(
  room: Room,
  stream: StreamFacts,
  request: RoomRequest | undefined,
  retryLimit: number,
): { reason: RoomFailureReason; leaveOut: Array<ReadonlySet<string>>; next: RoomRequest } | null {
  const reason = room.reason;
  if (room.state !== 'failed' || !isFailureReason(reason) || !FAILURE_BLAME[reason].retry)
    return null;
  if (!request || stream.done || stream.cancelled || stream.decodedTokens > 0) return null;
  if (stream.retries >= retryLimit || room.abortRequestedAt !== null) return null;
  if (room.origin === 'canary') return null;
  const { prefillEngine: p, decodeEngine: d } = room;
  // The engine to blame; otherwise (a fault of the pair, of whichever engine reported it, or of
  // no engine in particular: an overdue room) both where another pair of both exists, else one
  // of them. Never the same pair: it failed the room once.
  const blame = FAILURE_BLAME[reason].blame;
  const choices = blame === 'prefill' ? [[p]] : blame === 'decode' ? [[d]] : [[p, d], [p], [d]];
  const next = stream.currentTokens > 0 ? continuation(request, stream) : request;
  if (next !== request) {
    if (requestTextBytes(next) > maxRequestTextBytes()) return null;
    if (next.tokens !== undefined && stream.currentIds.length !== stream.currentTokens) return null;
  }
  return { reason, leaveOut: choices.map((c) => new Set(c)), next };
}

/**
 * The request a migrated room continues as: the same prompt, what was streamed so far as context
 * (its text, and its token ids for a model that is sent ids), and the tokens still to generate.
 */
export function continuation(request: RoomRequest, stream: StreamFacts): RoomRequest {
  return {
    ...request,
    maxTokens: request.maxTokens - stream.currentTokens,
    generated: stream.text,
    ...(request.tokens ? { tokens: [...request.tokens, ...stream.currentIds] } : {}),
  };
}
