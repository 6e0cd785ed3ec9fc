import { describe, expect, it } from 'vitest';
import type { JournalEvent } from '../room/events.ts';
import type { Room } from '../room/reducer.ts';
import { COMMIT_STAGES, type CommitStageBodies, runCommitStages } from './commit-stages.ts';
import type { Folded } from './rooms/room-book.ts';

/** Bodies that note their names in the order they ran; `retried` makes `retry` take the end. */
function recording(retried: boolean): { ran: string[]; bodies: CommitStageBodies } {
  const ran: string[] = [];
  const note = (name: string) => () => {
    ran.push(name);
    return undefined;
  };
  const group = <K extends string>(names: readonly K[]) =>
    Object.fromEntries(names.map((n) => [n, note(n)])) as Record<K, () => undefined>;
  const bodies: CommitStageBodies = {
    every: group(COMMIT_STAGES.every),
    room: group(COMMIT_STAGES.room),
    ended: {
      ...group(COMMIT_STAGES.ended),
      retry: () => {
        ran.push('retry');
        return retried;
      },
    },
  };
  return { ran, bodies };
}

const ev = { type: 'room.completed', room: 'r-1' } as JournalEvent;
const room = { room: 'r-1', state: 'completed' } as Room;
const live: Folded = { before: null, room, ended: null, admittedOn: null };
const ended: Folded = { ...live, ended: { stream: undefined, request: undefined } };

describe('the commit stages', () => {
  it('run in their declared order: every event, then a folded room’s, then an ended room’s', () => {
    const all = [...COMMIT_STAGES.every, ...COMMIT_STAGES.room, ...COMMIT_STAGES.ended];
    for (const [folded, want] of [
      [null, COMMIT_STAGES.every],
      [live, [...COMMIT_STAGES.every, ...COMMIT_STAGES.room]],
      [ended, all],
    ] as const) {
      const { ran, bodies } = recording(false);
      runCommitStages(bodies, ev, folded);
      expect(ran).toEqual(want);
    }
  });

  it('leave a room tried again to the retry: its client stream is not ended', () => {
    const { ran, bodies } = recording(true);
    runCommitStages(bodies, ev, ended);
    expect(ran.slice(-2)).toEqual(['let-go', 'retry']);
  });
});
