/**
 * AbortReq in every live state, alone and as a burst: every room ends `aborted`, each engine frees
 * its pages exactly once, pools return to capacity, and the next room completes normally.
 */
import { describe, expect, it } from 'vitest';
import type { ControlPlane } from '../src/control/control-plane.ts';
import { RoomEndedError } from '../src/control/intake/streams.ts';
import type { JournalEvent } from '../src/room/events.ts';
import { bootstrappedAtOnce, ENTERED_BY, RESTING_STATES, stateAtAbort } from './helpers/aborts.ts';
import { collect, poolsFull, prompt, startTestStack, waitFor } from './helpers/stack.ts';

// Slow enough that a room stays in prefilling, transferring and decoding while the abort commits;
// the other states last one engine round trip, longer than the abort's next commit.
const SLOW = {
  engineArgs: ['--prefill-us-per-token', '2000', '--decode-us-per-token', '20000'],
  engineEnv: { PDCTL_TRANSFER_FAULT: 'delay:300' },
};

async function expectAborted(control: ControlPlane, room: string): Promise<JournalEvent[]> {
  await waitFor(`room ${room} aborted and released by both engines`, async () => {
    const r = (await control.journal.timeline(room)).room;
    return r?.state === 'aborted' && r.releasedBy.length === 2;
  });
  const t = await control.journal.timeline(room);
  const releases = t.events.filter((e) => e.type === 'room.released').map((e) => e.engine);
  expect(new Set(releases)).toEqual(new Set([t.room?.prefillEngine, t.room?.decodeEngine]));
  expect(releases).toHaveLength(2);
  expect(t.events.filter((e) => e.type === 'room.aborted')).toHaveLength(1);
  return t.events;
}

describe('aborts', () => {
  it('ends a room aborted from every live state, then serves the next room normally', async () => {
    // Prefill slower still (400 ms for 50 words), so that the abort lands in prefilling even when
    // a loaded 2-core CI machine delays its commit. One prefill engine computing one room at a
    // time: a room admitted behind another waits in its queue, acknowledged by its decode engine
    // (`waiting_for_input`) — otherwise the prefill engine starts on `room.created` (protocol 7)
    // and the room rests in no state between.
    const { control } = await startTestStack({
      ...SLOW,
      prefillEngines: 1,
      engineArgs: [
        ...['--prefill-us-per-token', '8000', '--decode-us-per-token', '20000'],
        ...['--prefill-concurrency', '1'],
      ],
    });
    for (const [i, state] of RESTING_STATES.entries()) {
      const ahead =
        state === 'waiting_for_input'
          ? collect(control.submit({ prompt: prompt(50 + i, 50), maxTokens: 1 }))
          : null;
      const stream = control.submit({ prompt: prompt(i, 50), maxTokens: 50 });
      const sub = control.journal.subscribe(await control.journal.headSeq(), (ev) => {
        if (ev.room === stream.room && ev.type === ENTERED_BY[state]) {
          void control.abort(stream.room, 'drill_abort', 'test');
        }
      });
      const out = await collect(stream);
      sub.close();
      expect(out.error).toBeInstanceOf(RoomEndedError);
      expect((out.error as RoomEndedError).state).toBe('aborted');
      expect((out.error as RoomEndedError).reason).toBe('drill_abort');
      const events = await expectAborted(control, stream.room);
      expect(stateAtAbort(events), `abort meant for ${state}`).toBe(state);
      expect((await ahead)?.error ?? null).toBeNull();
    }
    const next = await collect(control.submit({ prompt: prompt(99, 10), maxTokens: 3 }));
    expect(next.error).toBeNull();
    // No room rests in bootstrapping: its two events are one commit.
    expect(bootstrappedAtOnce((await control.journal.timeline(next.room)).events)).toBe(true);
    const done = Date.now();
    await waitFor('every pool back to capacity', () => poolsFull(control, done));
  });

  it('aborts a burst of 100 rooms at once, in whatever state each is in', async () => {
    const { control } = await startTestStack({ ...SLOW, prefillEngines: 1, decodeEngines: 1 });
    const streams = Array.from({ length: 100 }, (_, i) =>
      control.submit({ prompt: prompt(i, 10 + (i % 60)), maxTokens: 40 }),
    );
    const outs = streams.map(collect);
    // Abort once the burst has spread over more than one stage.
    await waitFor(
      'rooms in more than one stage',
      () => new Set(streams.map((s) => control.room(s.room)?.state)).size > 2,
    );
    await Promise.all(streams.map((s) => control.abort(s.room, 'client_disconnect', 'test')));
    for (const out of await Promise.all(outs)) {
      expect((out.error as RoomEndedError | null)?.state).toBe('aborted');
    }
    const states = new Set<string>();
    for (const s of streams)
      states.add(stateAtAbort(await expectAborted(control, s.room)) as string);
    // The burst caught rooms in more than one stage.
    expect(states.size).toBeGreaterThan(1);
    const next = await collect(control.submit({ prompt: prompt(7, 10), maxTokens: 3 }));
    expect(next.error).toBeNull();
    const done = Date.now();
    await waitFor('every pool back to capacity', () => poolsFull(control, done));
    expect((await control.journal.verify()).ok).toBe(true);
  });
});
