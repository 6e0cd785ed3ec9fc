/**
 * A control plane's start: what it rebuilds from the journal before it takes a request — the
 * rooms left in flight (from the `rooms` projection), the start state (from its checkpoint and
 * the events after it: state.ts) and the room book with its page map — each step timed.
 */
import type { JournalLog } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import type { Cordons } from '../evidence/cordons.ts';
import { roomsLeft } from '../rooms/orphans.ts';
import type { RoomBook } from '../rooms/room-book.ts';
import type { Router } from '../routing/router.ts';
import { CHECKPOINT_NAME, trustCheckpoint } from './codec.ts';
import { StartState } from './state.ts';

/** What a start restored, for its log line and `control.startup`. */
export interface Restored {
  state: StartState;
  /** The checkpoint it started from; null: none, or one not trusted (`ignored` says why). */
  from: { seq: number; writtenAt: number } | null;
  ignored: string | null;
  /** Events of the state's types folded after the checkpoint (or from the start of the journal). */
  folded: number;
}

/**
 * The state through `headSeq`: the checkpoint if it can be trusted plus the events after it,
 * else a fold of the whole journal (and a warning that says why).
 */
export async function restoreState(
  journal: Pick<JournalLog, 'getCheckpoint' | 'tail' | 'readFrom'>,
  headSeq: number,
  log: Logger,
): Promise<Restored> {
  let state = new StartState();
  let from: Restored['from'] = null;
  let ignored: string | null = null;
  try {
    const stored = await journal.getCheckpoint(CHECKPOINT_NAME);
    const decoded = stored ? await trustCheckpoint(journal, stored, headSeq) : null;
    if (stored && decoded && 'state' in decoded) {
      state = decoded.state;
      from = { seq: stored.seq, writtenAt: stored.writtenAt };
    } else if (decoded && 'ignored' in decoded) ignored = decoded.ignored;
  } catch (err) {
    ignored = `it could not be read (${(err as Error).message})`;
  }
  if (ignored !== null)
    log.warn(
      { ignored },
      `state checkpoint ignored: ${ignored}; rebuilding the prefix index, pools, registrations and cordons from the whole journal (this start takes longer; the next checkpoint replaces it)`,
    );
  const folded = await state.foldJournal(journal, headSeq);
  return { state, from, ignored, folded };
}

/** What a start found and how long each step took, for its log line and `control.startup`. */
export interface Startup {
  /** Rooms the previous control plane left in flight, failed now. */
  orphansFailed: number;
  took: Readonly<Record<string, number>>;
  checkpoint: Restored['from'];
  /** Events folded after the checkpoint (after none: the whole journal's). */
  folded: number;
}

export const emptyStartup: Startup = { orphansFailed: 0, took: {}, checkpoint: null, folded: 0 };

type Step = <T>(name: string, f: () => Promise<T>) => Promise<T>;

/** Rebuilds the book, the router's index and the cordons from the journal through its head. */
export async function replayJournal(
  journal: JournalLog,
  into: { book: RoomBook; router: Router; cordons: Cordons; log: Logger },
  step: Step,
) {
  const { inFlight: orphans, all: left } = await step('roomsMs', () => roomsLeft(journal));
  const head = await journal.headSeq();
  const restored = await step('stateMs', () => restoreState(journal, head, into.log));
  const { state } = restored;
  await step('bookMs', () => into.book.load(journal, left, head, state.pools.values()));
  into.router.restore(state.index);
  into.cordons.restore(state.cordons);
  return { head, orphans, restored };
}
