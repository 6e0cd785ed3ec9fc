import { describe, expect, it } from 'vitest';
import type { JournalEvent } from '../../room/events.ts';
import { CommitDepth, MAX_COUNTED_DEPTH } from './commit-depth.ts';

/** A room's events as the journal commits them, appended by engines that name their cause. */
function room(d: CommitDepth, id = 'r1') {
  let seq = 0;
  const commit = (type: string, cause?: number): number => {
    const ev = { seq: ++seq, ts: 0, type, room: id, engine: null, source: 't', eventId: `e${seq}` };
    d.arrived(id, ev.eventId, cause);
    d.committed({ ...ev, data: {} } as JournalEvent);
    return seq;
  };
  return commit;
}

const total = (d: CommitDepth) => d.firstTokens.reduce((a, b) => a + b, 0);

describe('commit depth', () => {
  it('counts 1 when the prefill starts on room.created (protocol 9: it draws the first token), whatever else the engines sent meanwhile', () => {
    const d = new CommitDepth();
    const commit = room(d);
    const created = commit('room.created');
    commit('room.bootstrapped', created);
    commit('room.prefill_started', created);
    const moved = commit('room.transfer_completed', created);
    commit('room.decode_started', moved);
    expect(d.firstTokens[1]).toBe(1);
    expect(total(d)).toBe(1);
  });

  it('counts 2 when the prefill starts on room.bootstrapped (a room without a reservation)', () => {
    const d = new CommitDepth();
    const commit = room(d);
    const created = commit('room.created');
    const bootstrapped = commit('room.bootstrapped', created);
    commit('room.prefill_started', bootstrapped);
    expect(d.firstTokens[2]).toBe(1);
    expect(total(d)).toBe(1);
  });

  it('counts nothing without a cause it knows, for a room it never saw created or has forgotten', () => {
    const d = new CommitDepth();
    const commit = room(d);
    commit('room.prefill_started', 1); // created before this control plane started
    const created = commit('room.created');
    commit('room.prefill_started'); // no cause
    commit('room.prefill_started', 99); // a cause it never saw
    expect(total(d)).toBe(0);
    d.forget('r1');
    commit('room.prefill_started', created);
    expect(total(d)).toBe(0);
  });

  it(`counts a chain longer than ${MAX_COUNTED_DEPTH} as ${MAX_COUNTED_DEPTH}`, () => {
    const d = new CommitDepth();
    const commit = room(d);
    let last = commit('room.created');
    for (let i = 0; i < 12; i++) last = commit('room.x', last);
    commit('room.prefill_started', last);
    expect(d.firstTokens[MAX_COUNTED_DEPTH]).toBe(1);
  });
});
