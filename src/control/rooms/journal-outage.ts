/**
 * What the control plane does while the journal refuses writes (a full disk, a failing commit):
 * every room in flight stops at its next transition, so its client would wait for the state's
 * deadline. Once the outage has lasted the grace period, each such client is answered now; when
 * writes return, those rooms are failed in the journal (`journal_unavailable`) so their engines
 * free them (docs/incident.md, rule 2). Rooms a restarted control plane found in flight and could
 * not fail at its start (a full disk) are failed the same way, as `orphaned_by_restart`.
 *
 * Decided apart from done (issue 41): `decideOutage` is a pure function of what the control plane
 * sees at a tick — it returns the next state and the commands to run — and `JournalOutage` runs
 * them and feeds their outcomes back through `outageRecorded`. Its tests are given/when/then on
 * data (journal-outage.unit.test.ts): no journal, no clock.
 */

import type { JournalLog } from '../../journal/store.ts';
import type { Room } from '../../room/reducer.ts';
import { isTerminal, type RoomState } from '../../room/states.ts';
import { orphanedEventId } from './orphans.ts';

export interface OutageState {
  /** Since when the journal refuses writes (0: it takes them). */
  readonly since: number;
  /**
   * The last tick that found the journal refusing writes (0: none yet). Engines waiting on it
   * moved nothing meanwhile, so evidence against them counts only from then (stalls.ts).
   */
  readonly refusedAt: number;
  /**
   * Rooms to fail in the journal once it can, each with its reason: those whose clients were
   * answered during an outage, and the orphans a restart could not fail.
   */
  readonly unrecorded: ReadonlyMap<string, UnrecordedReason>;
  /** Their failures are being appended now: none is tried again until that ends. */
  readonly failing: boolean;
  /** A probe of the journal is being appended now. */
  readonly probing: boolean;
}

/** Why a room the journal could not take a failure for is failed once it can. */
export type UnrecordedReason = 'journal_unavailable' | 'orphaned_by_restart';

export const NO_OUTAGE: OutageState = Object.freeze({
  since: 0,
  refusedAt: 0,
  unrecorded: new Map<string, UnrecordedReason>(),
  failing: false,
  probing: false,
});

/** What the control plane sees at a tick. */
export interface OutageTick {
  now: number;
  writable: boolean;
  lastError: string | null;
  graceMs: number;
  /** Rooms whose clients are reading now. */
  streaming: readonly string[];
  /** The state of each unrecorded room now; absent: it left the control plane's view. */
  stateOf: (room: string) => RoomState | undefined;
}

export type OutageCommand =
  /** Answer the room's client now, with `reason`. */
  | { kind: 'end_stream'; room: string; reason: string }
  /** Fail these rooms in the journal, each at its stage, for its reason. */
  | { kind: 'record_failures'; rooms: readonly Unrecorded[] }
  /**
   * Append one `recovery.action` (`journal_writable`): the journal says it takes writes again only
   * once a commit succeeds, and with no failure left to record and every request refused, nothing
   * else would ever try one. It commits once — when the disk has room again — and says so.
   */
  | { kind: 'probe'; since: number; lastError: string | null };

/** A room to fail in the journal: where it stands now, and why. */
export interface Unrecorded {
  room: string;
  stage: RoomState;
  reason: UnrecordedReason;
}

/** One tick: the next state, and what to do. */
export function decideOutage(
  s: OutageState,
  t: OutageTick,
): { state: OutageState; commands: OutageCommand[] } {
  const commands: OutageCommand[] = [];
  let since = s.since;
  let refusedAt = s.refusedAt;
  if (!t.writable) {
    if (since === 0) since = t.now;
    refusedAt = t.now;
    if (t.now - since >= t.graceMs) {
      const reason = `the journal has refused writes for ${t.now - since} ms (${t.lastError ?? 'commit failed'}); this request cannot be completed, and its room will be failed in the journal once it can be written`;
      for (const room of t.streaming) commands.push({ kind: 'end_stream', room, reason });
    }
  } else since = 0;
  // Tried on every tick until it commits: the attempt is also what finds the disk has room again
  // (nothing else may be committing). Rooms that ended meanwhile need nothing.
  const unrecorded = new Map<string, UnrecordedReason>();
  const rooms: Unrecorded[] = [];
  for (const [room, reason] of s.unrecorded) {
    const stage = t.stateOf(room);
    if (stage === undefined || isTerminal(stage)) continue;
    unrecorded.set(room, reason);
    rooms.push({ room, stage, reason });
  }
  const record = rooms.length > 0 && !s.failing;
  if (record) commands.push({ kind: 'record_failures', rooms });
  const probe = !t.writable && !record && !s.failing && !s.probing;
  if (probe) commands.push({ kind: 'probe', since, lastError: t.lastError });
  return {
    state: {
      since,
      refusedAt,
      unrecorded,
      failing: s.failing || record,
      probing: s.probing || probe,
    },
    commands,
  };
}

/** What running the commands came to: clients answered, failures committed (or not). */
export function outageRecorded(
  s: OutageState,
  o:
    | { kind: 'streams_ended'; rooms: readonly string[] }
    | { kind: 'orphans_refused'; rooms: readonly string[] }
    | { kind: 'failures_recorded'; rooms: readonly string[] }
    | { kind: 'probed' },
): OutageState {
  if (o.kind === 'probed') return { ...s, probing: false };
  const unrecorded = new Map(s.unrecorded);
  if (o.kind !== 'failures_recorded') {
    const reason = o.kind === 'streams_ended' ? 'journal_unavailable' : 'orphaned_by_restart';
    for (const room of o.rooms) if (!unrecorded.has(room)) unrecorded.set(room, reason);
    return { ...s, unrecorded };
  }
  for (const room of o.rooms) unrecorded.delete(room);
  return { ...s, unrecorded, failing: false };
}

export interface OutageDeps {
  journal: Pick<JournalLog, 'append' | 'health'>;
  /** Rooms whose clients are reading now. */
  streaming: () => Iterable<string>;
  /** Answers the room's client with `reason`; false when nobody reads it. */
  endStream: (room: string, reason: string) => boolean;
  /** The room as the control plane has folded it now. */
  roomNow: (room: string) => Room | undefined;
  /** How long the journal may refuse writes before clients are answered. */
  graceMs: number;
}

/** Runs `decideOutage` on the control plane's tick, and does what it says. */
export class JournalOutage {
  private state: OutageState = NO_OUTAGE;

  constructor(private readonly deps: OutageDeps) {}

  /** The last time the journal was found refusing writes (unix ms); 0: never. */
  get refusedAt(): number {
    return this.state.refusedAt;
  }

  /**
   * Rooms a restart found in flight whose failure the journal refused at start: failed
   * (`orphaned_by_restart`) once it takes writes, not left to their states' deadlines (up to ten
   * minutes of their engines' pages: found by the simulator, seed 1429).
   */
  orphansRefused(rooms: readonly string[]): void {
    this.state = outageRecorded(this.state, { kind: 'orphans_refused', rooms });
  }

  /** One look at the journal; the control plane calls it every 250 ms. */
  tick(now: number): void {
    const { journal, streaming, endStream, roomNow, graceMs } = this.deps;
    const health = journal.health();
    const decided = decideOutage(this.state, {
      now,
      writable: health.writable,
      lastError: health.lastError,
      graceMs,
      streaming: [...streaming()],
      stateOf: (room) => roomNow(room)?.state,
    });
    this.state = decided.state;
    const ended: string[] = [];
    for (const c of decided.commands) {
      if (c.kind === 'end_stream') {
        if (endStream(c.room, c.reason)) ended.push(c.room);
      } else if (c.kind === 'probe') void this.probe(now, c.since, c.lastError);
      else void this.recordFailures(c.rooms);
    }
    if (ended.length > 0)
      this.state = outageRecorded(this.state, { kind: 'streams_ended', rooms: ended });
  }

  private async probe(now: number, since: number, lastError: string | null): Promise<void> {
    try {
      await this.deps.journal.append({
        type: 'recovery.action',
        source: 'control',
        data: {
          action: 'journal_writable',
          reason: `the journal refused writes from ${new Date(since).toISOString()} (${lastError ?? 'commit failed'})`,
          outcome: 'writes taken again',
          recoverMs: Math.max(0, now - since),
        },
      });
    } catch {
      // Still refused: the next tick tries again.
    }
    this.state = outageRecorded(this.state, { kind: 'probed' });
  }

  private async recordFailures(rooms: readonly Unrecorded[]) {
    const recorded: string[] = [];
    await Promise.all(
      rooms.map(async ({ room, stage, reason }) => {
        try {
          await this.deps.journal.append({
            type: 'room.failed',
            room,
            source: 'control',
            // An orphan's id is the one its restart tried (orphans.ts): a commit of either is one.
            eventId:
              reason === 'orphaned_by_restart' ? orphanedEventId(room) : `${room}:journal-outage`,
            data: { reason, stage, detectedBy: 'control' },
          });
          recorded.push(room);
        } catch {
          // Still refused: the next tick tries again.
        }
      }),
    );
    this.state = outageRecorded(this.state, { kind: 'failures_recorded', rooms: recorded });
  }
}
