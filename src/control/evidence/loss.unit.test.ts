/**
 * What becomes of a lost engine's rooms, and of a room that failed before its first token:
 * given/when/then on data — rooms folded by the real reducer, streams as the facts they hold.
 */
import { describe, expect, it } from 'vitest';
import { foldRoom, roomEvent } from '../../../test/helpers/room-events.ts';
import { maxRequestTextBytes, type RoomRequest } from '../../bus/protocol.ts';
import type { EventData } from '../../room/events.ts';
import { decideLoss, decideRetiring, decideRetry, type StreamFacts } from './loss.ts';

const ev = roomEvent;
const room = foldRoom;

/** `source`: who asked for the room — its origin. */
const created = (source = 'api') =>
  ev('room.created', { prefillEngine: 'p0', decodeEngine: 'd0' }, null, source);
const decoding = () =>
  room(
    created(),
    ev('room.bootstrap_started', {}, 'd0'),
    ev('room.bootstrapped', { pages: [1] }, 'd0'),
    ev('room.prefill_started', {}, 'p0'),
    ev('room.transfer_posted', {}, 'p0'),
    ev('room.transfer_completed', { bytes: 64, checksum: '0a', micros: 5 }, 'p0'),
    ev('room.decode_started', {}, 'd0'),
  );
const failed = (reason: EventData<'room.failed'>['reason'], source = 'api') =>
  room(created(source), ev('room.failed', { reason, stage: 'created', detectedBy: 'control' }));

/** A client that has had `tokens` words of its answer, in its first room. */
function stream(tokens: number, more: Partial<StreamFacts> = {}): StreamFacts {
  return {
    done: false,
    cancelled: false,
    text: ' word'.repeat(tokens),
    tokens,
    migrations: 0,
    retries: 0,
    currentTokens: tokens,
    decodedTokens: more.currentTokens ?? tokens,
    currentIds: [],
    ...more,
  };
}
const request: RoomRequest = { prompt: 'the river', maxTokens: 10 };

describe('decideLoss: a room of a lost engine', () => {
  it('given a live room whose client reads, then it migrates with what was streamed as context', () => {
    expect(decideLoss(decoding(), stream(3), request, 2)).toEqual({
      kind: 'migrate',
      next: { prompt: 'the river', maxTokens: 7, generated: ' word word word' },
    });
  });

  it('given a room that ended, then its release is journaled for the lost engine', () => {
    const done = room(created(), ev('room.aborted', { reason: 'x', source: 'api' }));
    expect(decideLoss(done, stream(0), request, 2)).toEqual({ kind: 'release' });
  });

  it('given nobody reads it, it is being aborted, or migration is off, then it is left to its deadline', () => {
    expect(decideLoss(decoding(), undefined, request, 2).kind).toBe('leave');
    expect(decideLoss(decoding(), stream(1, { done: true }), request, 2).kind).toBe('leave');
    expect(decideLoss(decoding(), stream(1), undefined, 2).kind).toBe('leave');
    expect(decideLoss(decoding(), stream(1), request, 0).kind).toBe('leave');
    const aborting = room(created(), ev('room.abort_requested', { reason: 'client_disconnect' }));
    expect(decideLoss(aborting, stream(1), request, 2).kind).toBe('leave');
  });

  it('given it moved as often as allowed, too much text to carry, or token ids missing, then it fails with that reason', () => {
    expect(decideLoss(decoding(), stream(1, { migrations: 2 }), request, 2)).toEqual({
      kind: 'fail',
      reason: 'migration_limit_reached',
    });
    const huge = { prompt: 'x'.repeat(maxRequestTextBytes()), maxTokens: 10 };
    expect(decideLoss(decoding(), stream(1), huge, 2)).toEqual({
      kind: 'fail',
      reason: 'too_large_to_migrate',
    });
    // A model that is sent token ids needs every generated one: 2 tokens streamed, 1 id known.
    const ids = { ...request, tokens: [5, 6] };
    expect(decideLoss(decoding(), stream(2, { currentIds: [9] }), ids, 2)).toEqual({
      kind: 'fail',
      reason: 'generated_tokens_unknown',
    });
    expect(decideLoss(decoding(), stream(2, { currentIds: [9, 10] }), ids, 2)).toMatchObject({
      kind: 'migrate',
      next: { tokens: [5, 6, 9, 10], maxTokens: 8 },
    });
  });
});

describe('decideRetiring: a room of an engine being retired', () => {
  it('given its prefill has not begun, then it moves with its request as it was', () => {
    const queued = room(
      created(),
      ev('room.bootstrap_started', {}, 'd0'),
      ev('room.bootstrapped', { pages: [1] }, 'd0'),
    );
    expect(queued.state).toBe('waiting_for_input');
    expect(decideRetiring(queued, stream(0), request, 2)).toEqual({ ...request, generated: '' });
    expect(decideRetiring(room(created()), stream(0), request, 2)).not.toBeNull();
  });

  it('given its prefill began, nobody reads it, or it used its migrations, then it stays to finish (never fails)', () => {
    const prefilling = room(created(), ev('room.prefill_started', {}, 'p0'));
    expect(decideRetiring(prefilling, stream(0), request, 2)).toBeNull();
    expect(decideRetiring(decoding(), stream(3), request, 2)).toBeNull();
    expect(decideRetiring(room(created()), undefined, request, 2)).toBeNull();
    expect(decideRetiring(room(created()), stream(0, { migrations: 2 }), request, 2)).toBeNull();
    expect(decideRetiring(room(created()), stream(0), request, 0)).toBeNull();
  });
});

describe('decideRetry: a room that failed before its decode engine streamed', () => {
  it('given the engine to blame, then it is tried again without that engine', () => {
    expect(decideRetry(failed('prefill_error'), stream(0), request, 1)).toEqual({
      reason: 'prefill_error',
      leaveOut: [new Set(['p0'])],
      next: request,
    });
    expect(decideRetry(failed('decode_error'), stream(0), request, 1)?.leaveOut).toEqual([
      new Set(['d0']),
    ]);
  });

  it('given the pair, or no engine, to blame, then without both where it can, else without either one', () => {
    expect(decideRetry(failed('kv_checksum_mismatch'), stream(0), request, 1)?.leaveOut).toEqual([
      new Set(['p0', 'd0']),
      new Set(['p0']),
      new Set(['d0']),
    ]);
    expect(decideRetry(failed('deadline_exceeded'), stream(0), request, 1)?.leaveOut).toEqual([
      new Set(['p0', 'd0']),
      new Set(['p0']),
      new Set(['d0']),
    ]);
  });

  it('given a reason another pair would share, a token streamed, a client gone, retries spent or a canary, then it is not tried again', () => {
    expect(decideRetry(failed('journal_unavailable'), stream(0), request, 1)).toBeNull();
    expect(decideRetry(failed('deadline_exceeded'), stream(1), request, 1)).toBeNull();
    const gone = stream(0, { cancelled: true });
    expect(decideRetry(failed('deadline_exceeded'), gone, request, 1)).toBeNull();
    const spent = stream(0, { retries: 1 });
    expect(decideRetry(failed('deadline_exceeded'), spent, request, 1)).toBeNull();
    expect(decideRetry(failed('deadline_exceeded', 'canary'), stream(0), request, 1)).toBeNull();
    expect(decideRetry(decoding(), stream(0), request, 1)).toBeNull();
  });

  it('given a migrated room that failed before a token of its own, then it is tried again: its client has the tokens of the room before, none of its', () => {
    // The bad-engine drill: a room streamed on a pair whose decode engine then hung; continued on
    // the corrupting prefill engine, it failed kv_checksum_mismatch, and its client got the 503.
    const migrated = stream(3, { migrations: 1, currentTokens: 0 });
    expect(decideRetry(failed('kv_checksum_mismatch'), migrated, request, 1)?.reason).toBe(
      'kv_checksum_mismatch',
    );
    const streamed = stream(3, { migrations: 1, currentTokens: 1 });
    expect(decideRetry(failed('kv_checksum_mismatch'), streamed, request, 1)).toBeNull();
  });

  it('given a room whose client had only the first token, from its prefill engine, then it is tried again from that token, as a migration continues', () => {
    const first = stream(1, { decodedTokens: 0, currentIds: [7] });
    expect(decideRetry(failed('transfer_failed'), first, request, 1)?.next).toEqual({
      ...request,
      generated: ' word',
      maxTokens: 9,
    });
    const ids = { ...request, tokens: [1, 2, 3] };
    expect(decideRetry(failed('transfer_failed'), first, ids, 1)?.next).toEqual({
      ...ids,
      generated: ' word',
      maxTokens: 9,
      tokens: [1, 2, 3, 7],
    });
    // A model sent token ids cannot continue without the first one's id.
    const noId = stream(1, { decodedTokens: 0 });
    expect(decideRetry(failed('transfer_failed'), noId, ids, 1)).toBeNull();
  });
});
