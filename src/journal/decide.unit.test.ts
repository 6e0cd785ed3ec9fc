/**
 * The journal's decision per batch (decide.ts), given / when / then: the journal as it was
 * (`given`), a batch (`when`), what each event became and what is to be persisted (`then`). Every
 * backend persists exactly this; the journal contract tests (test/helpers/journal-contract.ts)
 * show each does, against its own storage.
 */
import { describe, expect, it } from 'vitest';
import type { PendingEvent } from '../room/events.ts';
import { reduce } from '../room/reducer.ts';
import { type BatchGiven, decideBatch, type StoredId } from './decide.ts';

let n = 0;
function ev(
  type: string,
  room: string | null,
  data: unknown = {},
  over: Partial<PendingEvent> = {},
) {
  return {
    ts: 1000 + n,
    type,
    room,
    engine: null,
    source: 'test',
    eventId: `e-${++n}`,
    data,
    ...over,
  } as PendingEvent;
}

const created = (room: string) =>
  ev('room.created', room, { prefillEngine: 'prefill-0', decodeEngine: 'decode-0' });

/** A journal holding nothing, or the ids and rooms given. */
function given(
  headSeq = 0,
  stored: Record<string, StoredId> = {},
  rooms: BatchGiven['room'] = () => undefined,
): BatchGiven {
  return { headSeq, stored: (e) => stored[e.eventId], room: rooms };
}

describe('decideBatch', () => {
  it('given an empty journal, when a room is created and started, then both apply in order with new seqs', () => {
    const a = created('r-1');
    const b = ev('room.prefill_started', 'r-1', {}, { engine: 'prefill-0' });
    const d = decideBatch([a, b], given(41));
    expect(d.outcomes).toEqual([
      [0, 42, 'created'],
      [0, 43, 'prefilling'],
    ]);
    expect(d.events.map((e) => [e.seq, e.type])).toEqual([
      [42, 'room.created'],
      [43, 'room.prefill_started'],
    ]);
    expect(d.rooms.get('r-1')).toMatchObject({ state: 'prefilling', lastSeq: 43 });
    expect(d.lastSeq).toBe(43);
  });

  it('given a room the journal holds, when an event does not fit its state, then a rejection record takes its seq', () => {
    const base = reduce(null, { ...created('r-2'), seq: 7 });
    if (!base.ok) throw new Error('created must apply');
    const late = ev('room.decode_started', 'r-2', {}, { engine: 'decode-0' });
    const d = decideBatch(
      [late],
      given(9, {}, (name) => (name === 'r-2' ? base.room : undefined)),
    );
    expect(d.outcomes[0]?.[0]).toBe(1);
    expect(d.outcomes[0]?.[1]).toBe(10);
    expect(d.events).toEqual([
      expect.objectContaining({
        seq: 10,
        type: 'room.event_rejected',
        data: expect.objectContaining({ eventType: 'room.decode_started', state: 'created' }),
      }),
    ]);
    // The room is as it was: a refused event changes nothing of it.
    expect(d.rooms.size).toBe(0);
  });

  it('given an id stored for the same event, when it is sent again, then it is a duplicate and nothing is stored', () => {
    const again = created('r-3');
    const stored = {
      [again.eventId]: {
        seq: 5,
        storedType: 'room.created',
        room: 'r-3',
        source: 'test',
        eventType: 'room.created',
      },
    };
    const d = decideBatch([again], given(20, stored));
    expect(d.outcomes).toEqual([[2, 5, false]]);
    expect(d.events).toEqual([]);
    expect(d.lastSeq).toBe(20);
  });

  it('given an id stored for another source’s event, when a different event claims it, then it conflicts and nothing is stored', () => {
    const other = created('r-4');
    const stored = {
      [other.eventId]: {
        seq: 3,
        storedType: 'room.created',
        room: 'r-9',
        source: 'someone-else',
        eventType: 'room.created',
      },
    };
    const d = decideBatch([other], given(20, stored));
    expect(d.outcomes[0]?.[0]).toBe(3);
    expect(String(d.outcomes[0]?.[2])).toMatch(/is taken by seq 3 .* is not that event/);
    expect(d.events).toEqual([]);
  });

  it('when one batch holds an event twice, then the second is a duplicate of the first, and of its rejection record too', () => {
    const a = created('r-5');
    const bad = ev('room.transfer_completed', 'r-6');
    const d = decideBatch([a, { ...a }, bad, { ...bad }], given());
    expect(d.outcomes.map((o) => o[0])).toEqual([0, 2, 1, 2]);
    expect(d.outcomes[1]).toEqual([2, 1, false]);
    expect(d.outcomes[3]).toEqual([2, 2, true]);
    expect(d.events.map((e) => e.type)).toEqual(['room.created', 'room.event_rejected']);
  });

  it('when an event is not a room’s, then it is stored with no room change', () => {
    const hello = ev(
      'engine.registered',
      null,
      { role: 'prefill', incarnation: 'i-1' },
      {
        engine: 'prefill-0',
      },
    );
    const d = decideBatch([hello], given(1));
    expect(d.outcomes).toEqual([[0, 2, null]]);
    expect(d.rooms.size).toBe(0);
  });
});
