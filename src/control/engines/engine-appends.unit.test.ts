import { describe, expect, it } from 'vitest';
import { checkAppend } from './engine-appends.ts';

describe('checkAppend: what an engine may append, checked where it comes off the bus', () => {
  it("takes its role's room events with their type's data, typed by their type", () => {
    const checked = checkAppend('prefill', {
      type: 'room.transfer_completed',
      room: 'r1',
      data: { bytes: 4096, checksum: '0a0b0c0d', micros: 90, transport: 'shm' },
      cause: 7,
    });
    expect(checked.ok).toBe(true);
    if (!checked.ok || checked.event.type !== 'room.transfer_completed')
      throw new Error('narrowed');
    // Narrowed by its type: no cast to read the data.
    expect(checked.event.data.bytes).toBe(4096);
    expect(checked.event.cause).toBe(7);
  });

  it("refuses another role's events and events the journal writes itself, as not its own", () => {
    expect(checkAppend('decode', { type: 'room.transfer_posted', room: 'r1', data: {} })).toEqual({
      ok: false,
      reason: 'not_owner',
      message: 'a decode engine may not append room.transfer_posted',
    });
    for (const type of ['room.created', 'engine.lost', 'room.event_rejected', 'no.such'])
      expect(checkAppend('prefill', { type, room: 'r1', data: {} })).toMatchObject({
        ok: false,
        reason: 'not_owner',
      });
  });

  it('refuses a failure its role cannot have seen: a decode engine saying the prefill failed', () => {
    const failed = (reason: string) => ({
      type: 'room.failed',
      room: 'r1',
      data: { reason, stage: 'decoding', detectedBy: 'd0' },
    });
    expect(checkAppend('decode', failed('prefill_error'))).toMatchObject({
      ok: false,
      reason: 'not_owner',
      claim: 'prefill_error',
      message: expect.stringMatching(
        /^a decode engine cannot detect prefill_error; it may fail a room for .*decode_error/,
      ),
    });
    for (const reason of ['decode_error', 'kv_checksum_mismatch'])
      expect(checkAppend('prefill', failed(reason))).toMatchObject({ ok: false, claim: reason });
    // Nor may an engine append what only the control plane finds.
    expect(checkAppend('decode', failed('deadline_exceeded'))).toMatchObject({ ok: false });
    expect(checkAppend('decode', failed('decode_error')).ok).toBe(true);
    expect(checkAppend('prefill', failed('decode_pool_stale')).ok).toBe(true);
    // A reason of a newer engine is recorded as text, never refused.
    expect(checkAppend('decode', failed('a_newer_reason')).ok).toBe(true);
  });

  it('refuses data that is not its type’s, naming the field', () => {
    expect(
      checkAppend('prefill', {
        type: 'room.transfer_completed',
        room: 'r1',
        data: { bytes: -1, checksum: '0a0b0c0d', micros: 90 },
      }),
    ).toMatchObject({
      ok: false,
      reason: 'bad_payload',
      message: expect.stringMatching(/^room\.transfer_completed: data\.bytes /),
    });
    expect(
      checkAppend('prefill', {
        type: 'room.transfer_posted',
        room: 'r1',
        data: { storedBlocks: ['not-a-block-name'] },
      }),
    ).toMatchObject({
      ok: false,
      reason: 'bad_payload',
      message: expect.stringMatching(/data\.storedBlocks\.0/),
    });
    expect(
      checkAppend('decode', { type: 'room.completed', room: 'r1', data: { unknownField: 1 } }),
    ).toMatchObject({ ok: false, reason: 'bad_payload' });
  });
});
