/**
 * The journal-outage decisions, given/when/then on data (issue 41): what the control plane sees
 * at a tick in, the next state and the commands out. No journal, no clock, no control plane.
 */
import { describe, expect, it } from 'vitest';
import type { RoomState } from '../../room/states.ts';
import { decideOutage, NO_OUTAGE, type OutageTick, outageRecorded } from './journal-outage.ts';

const tick = (over: Partial<OutageTick> = {}): OutageTick => ({
  now: 10_000,
  writable: true,
  lastError: null,
  graceMs: 1000,
  streaming: [],
  stateOf: () => 'decoding',
  ...over,
});

describe('decideOutage', () => {
  it('given a writable journal, does nothing', () => {
    const { state, commands } = decideOutage(NO_OUTAGE, tick({ streaming: ['r1'] }));
    expect(commands).toEqual([]);
    expect(state.since).toBe(0);
  });

  it('given writes refused, answers nobody within the grace, then every reading client', () => {
    const down = tick({ writable: false, lastError: 'SQLITE_FULL', streaming: ['r1', 'r2'] });
    const first = decideOutage(NO_OUTAGE, down);
    // Nothing to record: the journal is probed (below); no client is answered yet.
    expect(first.commands.map((c) => c.kind)).toEqual(['probe']);
    expect(first.state.since).toBe(10_000);
    const later = decideOutage(first.state, { ...down, now: 11_000 });
    expect(later.commands.map((c) => c.kind)).toEqual(['end_stream', 'end_stream']);
    expect(later.commands[0]).toMatchObject({
      room: 'r1',
      reason: expect.stringContaining('refused writes for 1000 ms (SQLITE_FULL)'),
    });
  });

  it('when clients were answered, records their rooms failed at their stage once writes return, one attempt at a time', () => {
    const answered = outageRecorded(
      { ...NO_OUTAGE, since: 5000 },
      { kind: 'streams_ended', rooms: ['r1', 'r2', 'r3'] },
    );
    const stages: Record<string, RoomState> = { r1: 'decoding', r2: 'completed', r3: 'prefilling' };
    const back = decideOutage(answered, tick({ stateOf: (r) => stages[r] }));
    // r2 ended meanwhile: nothing to record for it.
    expect(back.commands).toEqual([
      {
        kind: 'record_failures',
        rooms: [
          { room: 'r1', stage: 'decoding', reason: 'journal_unavailable' },
          { room: 'r3', stage: 'prefilling', reason: 'journal_unavailable' },
        ],
      },
    ]);
    expect(back.state).toMatchObject({ since: 0, failing: true });
    // While that attempt runs, no second one starts.
    expect(decideOutage(back.state, tick({ stateOf: (r) => stages[r] })).commands).toEqual([]);
    // r3 was refused again: the next tick tries it alone.
    const after = outageRecorded(back.state, { kind: 'failures_recorded', rooms: ['r1'] });
    expect([...after.unrecorded.keys()]).toEqual(['r3']);
    expect(decideOutage(after, tick({ stateOf: (r) => stages[r] })).commands).toEqual([
      {
        kind: 'record_failures',
        rooms: [{ room: 'r3', stage: 'prefilling', reason: 'journal_unavailable' }],
      },
    ]);
  });

  it('fails the orphans a restart could not fail as orphaned_by_restart, once writes return', () => {
    // Found by the simulator (seed 1429): a control plane restarted on a full disk left its
    // orphans to their states' deadlines — ten minutes of a decoding room's pages.
    const left = outageRecorded(NO_OUTAGE, { kind: 'orphans_refused', rooms: ['o1'] });
    // A client answered meanwhile does not change why the orphan is failed.
    const both = outageRecorded(left, { kind: 'streams_ended', rooms: ['o1', 'r1'] });
    const stages: Record<string, RoomState> = { o1: 'decoding', r1: 'prefilling' };
    expect(decideOutage(both, tick({ stateOf: (r) => stages[r] })).commands).toEqual([
      {
        kind: 'record_failures',
        rooms: [
          { room: 'o1', stage: 'decoding', reason: 'orphaned_by_restart' },
          { room: 'r1', stage: 'prefilling', reason: 'journal_unavailable' },
        ],
      },
    ]);
  });

  it('forgets a room that left the control plane’s view', () => {
    const answered = outageRecorded(NO_OUTAGE, { kind: 'streams_ended', rooms: ['gone'] });
    const { state, commands } = decideOutage(answered, tick({ stateOf: () => undefined }));
    expect(commands).toEqual([]);
    expect(state.unrecorded.size).toBe(0);
  });

  it('given writes refused and nothing to record, probes the journal, one probe at a time, until one commits', () => {
    // Found by the simulator (seed 1, --faults disk-full): every request was refused while the
    // journal said it was not writable, and nothing else appended to find out it was again.
    const down = tick({ writable: false, lastError: 'SQLITE_FULL' });
    const first = decideOutage(NO_OUTAGE, down);
    expect(first.commands).toEqual([{ kind: 'probe', since: 10_000, lastError: 'SQLITE_FULL' }]);
    expect(first.state.probing).toBe(true);
    expect(decideOutage(first.state, { ...down, now: 10_250 }).commands).toEqual([]);
    // That probe was refused: the next tick probes again.
    const refused = outageRecorded(first.state, { kind: 'probed' });
    expect(decideOutage(refused, { ...down, now: 10_500 }).commands).toEqual([
      { kind: 'probe', since: 10_000, lastError: 'SQLITE_FULL' },
    ]);
    // A probe committed: the journal is writable, and nothing more is probed.
    expect(decideOutage(refused, tick({ now: 10_750 })).commands).toEqual([]);
  });

  it('given writes refused, remembers the last tick that saw it after they return: engines waiting on the journal are not blamed', () => {
    // Found by the simulator (--faults disk-full, seeds 23 and 31): the moment the journal took
    // writes again, every engine whose rooms had waited on it looked stalled, and the ladder
    // reset them all.
    const down = decideOutage(NO_OUTAGE, tick({ writable: false, now: 10_000 }));
    const still = decideOutage(down.state, tick({ writable: false, now: 12_000 }));
    expect(still.state.refusedAt).toBe(12_000);
    const back = decideOutage(still.state, tick({ now: 12_250 }));
    expect(back.state).toMatchObject({ since: 0, refusedAt: 12_000 });
    expect(decideOutage(back.state, tick({ now: 60_000 })).state.refusedAt).toBe(12_000);
  });
});
