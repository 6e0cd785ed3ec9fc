/**
 * What the control plane does while the journal refuses writes (a full disk, a failing commit):
 * every room in flight stops at its next transition, so its client would wait for the state's
 * deadline. Once the outage has lasted the grace period, each such client is answered now; when
 * writes return, those rooms are failed in the journal (`journal_unavailable`) so their engines
 * free them (docs/incident.md, rule 2).
 *
 * Decided apart from done (issue 41): `decideOutage` is a pure function of what the control plane
 * sees at a tick — it returns the next state and the commands to run — and `JournalOutage` runs
 * them and feeds their outcomes back through `outageRecorded`. Its tests are given/when/then on
 * data (journal-outage.unit.test.ts): no journal, no clock.
 */
import type { Room } from '../journal/reducer.ts';
import { isTerminal, type RoomState } from '../journal/states.ts';
import type { JournalStore } from '../journal/store.ts';

export interface OutageState {
  /** Since when the journal refuses writes (0: it takes them). */
  readonly since: number;
  /**
   * The last tick that found the journal refusing writes (0: none yet). Engines waiting on it
   * moved nothing meanwhile, so evidence against them counts only from then (stalls.ts).
   */
  readonly refusedAt: number;
  /** Rooms whose clients were answered during an outage: failed in the journal once it can. */
  readonly unrecorded: ReadonlySet<string>;
  /** Their failures are being appended now: none is tried again until that ends. */
  readonly failing: boolean;
  /** A probe of the journal is being appended now. */
  readonly probing: boolean;
}

export const NO_OUTAGE: OutageState = Object.freeze({
  since: 0,
  refusedAt: 0,
  unrecorded: new Set<string>(),
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
  /** Fail these rooms in the journal (`journal_unavailable`), each at its stage. */
  | { kind: 'record_failures'; rooms: ReadonlyArray<{ room: string; stage: RoomState }> }
  /**
   * Append one `recovery.action` (`journal_writable`): the journal says it takes writes again only
   * once a commit succeeds, and with no failure left to record and every request refused, nothing
   * else would ever try one. It commits once — when the disk has room again — and says so.
   */
  | { kind: 'probe'; since: number; lastError: string | null };

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
  const unrecorded = new Set<string>();
  const rooms: Array<{ room: string; stage: RoomState }> = [];
  for (const room of s.unrecorded) {
    const stage = t.stateOf(room);
    if (stage === undefined || isTerminal(stage)) continue;
    unrecorded.add(room);
    rooms.push({ room, stage });
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
    | { kind: 'failures_recorded'; rooms: readonly string[] }
    | { kind: 'probed' },
): OutageState {
  if (o.kind === 'probed') return { ...s, probing: false };
  const unrecorded = new Set(s.unrecorded);
  if (o.kind === 'streams_ended') {
    for (const room of o.rooms) unrecorded.add(room);
    return { ...s, unrecorded };
  }
  for (const room of o.rooms) unrecorded.delete(room);
  return { ...s, unrecorded, failing: false };
}

export interface OutageDeps {
  journal: Pick<JournalStore, 'append' | 'health'>;
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

  private async recordFailures(rooms: ReadonlyArray<{ room: string; stage: RoomState }>) {
    const recorded: string[] = [];
    await Promise.all(
      rooms.map(async ({ room, stage }) => {
        try {
          await this.deps.journal.append({
            type: 'room.failed',
            room,
            source: 'control',
            eventId: `${room}:journal-outage`,
            data: { reason: 'journal_unavailable', stage, detectedBy: 'control' },
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
