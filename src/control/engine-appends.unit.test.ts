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
