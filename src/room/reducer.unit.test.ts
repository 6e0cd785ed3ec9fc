import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { EventType, RoomEventType } from './events.ts';
import { fold, type ReducibleEvent, type Room, reduce } from './reducer.ts';
import { DEFAULT_STATE_DEADLINES_MS, isTerminal, type RoomState } from './states.ts';

const SEED = Number(process.env.FC_SEED ?? Date.now() % 2 ** 31);

let seq = 0;
function ev(
  type: EventType,
  room: string,
  data: Record<string, unknown> = {},
  engine: string | null = null,
  ts = 1000 + seq,
): ReducibleEvent {
  seq++;
  // A builder of arbitrary events (the tests feed the reducer wrong ones on purpose).
  return { seq, ts, type, room, engine, data } as ReducibleEvent;
}

const CREATED = { prefillEngine: 'p0', decodeEngine: 'd0' };
const HAPPY: Array<[EventType, Record<string, unknown>, string | null]> = [
  ['room.bootstrap_started', {}, 'd0'],
  ['room.bootstrapped', { pages: [3, 4] }, 'd0'],
  ['room.prefill_started', {}, 'p0'],
  ['room.transfer_posted', { pairs: 2 }, 'p0'],
  ['room.transfer_completed', { bytes: 128, checksum: 'ab', micros: 9 }, 'p0'],
  ['room.decode_started', {}, 'd0'],
  ['room.completed', { tokens: 5, finishReason: 'stop' }, 'd0'],
];

function applyAll(events: ReducibleEvent[]): Room {
  let room: Room | null = null;
  for (const e of events) {
    const r = reduce(room, e);
    if (!r.ok) throw new Error(`${e.type} rejected: ${r.reason}`);
    room = r.room;
  }
  return room as Room;
}

describe('reduce, given / when / then', () => {
  it('walks the happy path through every state and records what each event carries', () => {
    const events = [
      ev('room.created', 'r1', CREATED, null, 1000),
      ...HAPPY.map(([t, d, e], i) => ev(t, 'r1', d, e, 1010 + i * 10)),
    ];
    const room = applyAll(events);
    expect(room.state).toBe('completed');
    expect(room.kvPages).toBe(2);
    expect([room.transferBytes, room.transferMicros, room.checksum]).toEqual([128, 9, 'ab']);
    expect([room.tokens, room.finishReason]).toEqual([5, 'stop']);
    expect(room.terminalAt).toBe(1070);
    expect(room.deadlineAt).toBeNull();
    expect(room.eventCount).toBe(8);
  });

  it('sets the deadline of each state from the time it was entered', () => {
    const created = applyAll([
      ev('room.created', 'r2', { ...CREATED, deadlinesMs: { bootstrapping: 77 } }, null, 5000),
    ]);
    expect(created.deadlineAt).toBe(5000 + DEFAULT_STATE_DEADLINES_MS.created);
    const r = reduce(created, ev('room.bootstrap_started', 'r2', {}, 'd0', 5010));
    expect(r.ok && r.room.deadlineAt).toBe(5087);
  });

  it('rejects a skipped step, naming the state the room is in', () => {
    const room = applyAll([ev('room.created', 'r3', CREATED)]);
    const r = reduce(room, ev('room.transfer_posted', 'r3', {}, 'p0'));
    expect(r).toMatchObject({ ok: false, reason: 'illegal_transition', state: 'created' });
    expect(!r.ok && r.detail).toBe('room.transfer_posted needs state prefilling, room is created');
  });

  it('lets prefill start on room.created and takes the decode engine’s acknowledgement later without moving the room back', () => {
    const room = applyAll([
      ev('room.created', 'r3b', CREATED),
      ev('room.prefill_started', 'r3b', {}, 'p0'),
      ev('room.transfer_posted', 'r3b', { pairs: 2 }, 'p0'),
      ev('room.bootstrap_started', 'r3b', {}, 'd0'),
      ev('room.transfer_completed', 'r3b', { bytes: 128, checksum: 'ab', micros: 9 }, 'p0'),
      ev('room.bootstrapped', 'r3b', { pages: [3, 4] }, 'd0'),
    ]);
    expect([room.state, room.kvPages]).toEqual(['transferred', 2]);
    // Once the decode engine decodes, its acknowledgement is not a thing it can still send.
    const decoding = applyAll([
      ev('room.created', 'r3c', CREATED),
      ev('room.bootstrap_started', 'r3c', {}, 'd0'),
      ev('room.prefill_started', 'r3c', {}, 'p0'),
      ev('room.bootstrapped', 'r3c', { pages: [1] }, 'd0'),
      ev('room.transfer_posted', 'r3c', { pairs: 1 }, 'p0'),
      ev('room.transfer_completed', 'r3c', { bytes: 1, checksum: 'a', micros: 1 }, 'p0'),
      ev('room.decode_started', 'r3c', {}, 'd0'),
    ]);
    expect(decoding.state).toBe('decoding');
    expect(reduce(decoding, ev('room.bootstrapped', 'r3c', { pages: [1] }, 'd0'))).toMatchObject({
      ok: false,
      reason: 'illegal_transition',
    });
  });

  it('rejects an event from the wrong engine of the pair', () => {
    const room = applyAll([ev('room.created', 'r4', CREATED)]);
    expect(reduce(room, ev('room.bootstrap_started', 'r4', {}, 'p0'))).toMatchObject({
      ok: false,
      reason: 'wrong_engine',
    });
  });

  it('rejects events for unknown rooms and a second room.created', () => {
    expect(reduce(null, ev('room.aborted', 'x', { reason: 'r', source: 's' }))).toMatchObject({
      ok: false,
      reason: 'unknown_room',
      state: null,
    });
    const room = applyAll([ev('room.created', 'r5', CREATED)]);
    expect(reduce(room, ev('room.created', 'r5', CREATED))).toMatchObject({
      ok: false,
      reason: 'room_exists',
    });
  });

  it('treats abort_requested as idempotent: the first reason and time stay', () => {
    let room = applyAll([ev('room.created', 'r6', CREATED)]);
    const first = reduce(
      room,
      ev('room.abort_requested', 'r6', { reason: 'client_disconnect' }, null, 2000),
    );
    room = (first as { room: Room }).room;
    const again = reduce(room, ev('room.abort_requested', 'r6', { reason: 'admin' }, null, 3000));
    expect(again.ok).toBe(true);
    expect(
      again.ok && [again.room.abortRequestedAt, again.room.abortReason, again.room.state],
    ).toEqual([2000, 'client_disconnect', 'created']);
  });

  it('keeps terminal states final but accepts one release per engine of the pair', () => {
    let room = applyAll([
      ev('room.created', 'r7', CREATED),
      ev('room.failed', 'r7', {
        reason: 'deadline_exceeded',
        stage: 'created',
        detectedBy: 'watchdog',
      }),
    ]);
    expect(room).toMatchObject({
      state: 'failed',
      reason: 'deadline_exceeded',
      failedStage: 'created',
      detectedBy: 'watchdog',
    });
    expect(reduce(room, ev('room.aborted', 'r7', { reason: 'x', source: 'y' }))).toMatchObject({
      ok: false,
      reason: 'room_terminal',
      state: 'failed',
    });
    expect(reduce(room, ev('room.abort_requested', 'r7', { reason: 'late' }))).toMatchObject({
      ok: false,
      reason: 'room_terminal',
    });
    room = (reduce(room, ev('room.released', 'r7', {}, 'd0')) as { room: Room }).room;
    expect(room.releasedBy).toEqual(['d0']);
    expect(reduce(room, ev('room.released', 'r7', {}, 'd0'))).toMatchObject({
      ok: false,
      reason: 'duplicate_release',
    });
    expect(reduce(room, ev('room.released', 'r7', {}, 'd9'))).toMatchObject({
      ok: false,
      reason: 'not_room_engine',
    });
  });

  it('never mutates the room it is given', () => {
    const room = applyAll([ev('room.created', 'r8', CREATED)]);
    const snapshot = structuredClone(room);
    reduce(room, ev('room.bootstrap_started', 'r8', {}, 'd0'));
    reduce(room, ev('room.released', 'r8', {}, 'd0'));
    expect(room).toEqual(snapshot);
  });
});

// The legal-transition table of docs/design.md §3, written out again independently of the reducer:
// each event's [state before, state after] pairs.
const ACK_LATER = (s: RoomState): [RoomState, RoomState] => [s, s];
const NEXT: Partial<Record<RoomEventType, Array<[RoomState, RoomState]>>> = {
  'room.bootstrap_started': [
    ['created', 'bootstrapping'],
    ...(['prefilling', 'transferring', 'transferred'] as const).map(ACK_LATER),
  ],
  'room.bootstrapped': [
    ['bootstrapping', 'waiting_for_input'],
    ...(['prefilling', 'transferring', 'transferred'] as const).map(ACK_LATER),
  ],
  'room.prefill_started': [
    ['created', 'prefilling'],
    ['bootstrapping', 'prefilling'],
    ['waiting_for_input', 'prefilling'],
  ],
  'room.transfer_posted': [['prefilling', 'transferring']],
  'room.transfer_completed': [['transferring', 'transferred']],
  'room.decode_started': [['transferred', 'decoding']],
  'room.completed': [['decoding', 'completed']],
};
const DATA: Record<string, Record<string, unknown>> = {
  'room.created': CREATED,
  'room.bootstrapped': { pages: [1] },
  'room.transfer_completed': { bytes: 1, checksum: 'a', micros: 1 },
  'room.completed': { tokens: 1, finishReason: 'stop' },
  'room.aborted': { reason: 'client_disconnect', source: 'client' },
  'room.failed': { reason: 'deadline_exceeded', stage: 'created', detectedBy: 'watchdog' },
  'room.migrated': { toRoom: 'elsewhere' },
  'room.abort_requested': { reason: 'client_disconnect' },
};
const TYPES: RoomEventType[] = [
  'room.created',
  ...(Object.keys(NEXT) as RoomEventType[]),
  'room.aborted',
  'room.failed',
  'room.migrated',
  'room.abort_requested',
  'room.released',
];

const arbEvent = fc.record({
  type: fc.constantFrom(...TYPES),
  room: fc.constantFrom('ra', 'rb', 'rc'),
  engine: fc.constantFrom<string | null>(null, 'p0', 'd0', 'zz'),
  dt: fc.integer({ min: 0, max: 5000 }),
});

describe('reduce, properties over random event sequences', () => {
  it('terminal states are final, illegal transitions are rejected with a reason, and the projection equals the fold', () => {
    fc.assert(
      fc.property(fc.array(arbEvent, { maxLength: 120 }), (raw) => {
        let ts = 0;
        const events: ReducibleEvent[] = raw.map((r, i) => {
          ts += r.dt;
          const engine = r.type === 'room.released' && r.engine === null ? 'd0' : r.engine;
          const data = DATA[r.type] ?? {};
          return { seq: i + 1, ts, type: r.type, room: r.room, engine, data } as ReducibleEvent;
        });
        const live = new Map<string, Room>();
        const applied: ReducibleEvent[] = [];
        for (const e of events) {
          const before = live.get(e.room as string) ?? null;
          const r = reduce(before, e);
          if (!r.ok) {
            expect(r.reason).toMatch(/^[a-z_]+$/);
            expect(r.state).toBe(before?.state ?? null);
            if (before && e.type === 'room.created') expect(r.reason).toBe('room_exists');
            else if (before && isTerminal(before.state) && e.type !== 'room.released')
              expect(r.reason).toBe('room_terminal');
            continue;
          }
          applied.push(e);
          const after = r.room;
          if (before === null) {
            expect(e.type).toBe('room.created');
          } else if (isTerminal(before.state)) {
            expect(e.type).toBe('room.released');
            expect(after.state).toBe(before.state);
          } else {
            const steps = NEXT[e.type as RoomEventType];
            if (steps) expect(steps).toContainEqual([before.state, after.state]);
            else if (['room.aborted', 'room.failed', 'room.migrated'].includes(e.type))
              expect(after.state).toBe(e.type.slice(5));
            else expect(after.state).toBe(before.state);
          }
          live.set(after.room, after);
        }
        const folded = fold(events);
        expect(folded.rooms).toEqual(live);
        expect(fold(applied).inconsistent).toEqual([]);
      }),
      { seed: SEED, numRuns: 500, verbose: true },
    );
  });
});
