/**
 * The abort workflow (docs/design.md §2): an AbortReq is journaled as `room.abort_requested`; the
 * engines stop the room and each journals `room.released`; once both have released — or after a
 * grace period, for an engine that never answers — the room is journaled `room.aborted`, with the
 * reason of the first request and who asked.
 *
 * Decided apart from done (issue 41): `decideAbort` is a pure function of the pending aborts and
 * one input (an event committed, a grace period over, a room ended) that returns the next state
 * and the commands to run; `Aborts` runs them on the clock and the journal. Its tests are
 * given/when/then on data (aborts.unit.test.ts): no journal, no timers.
 */

import type { AppendResult, JournalLog } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import { type Clock, systemClock, type Timer } from '../../ports/clock.ts';
import type { JournalEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import { isTerminal } from '../../room/states.ts';

/** Both engines of the room's pair have journaled `room.released`. */
export function releasedByBoth(room: Room): boolean {
  return (
    room.releasedBy.includes(room.prefillEngine) && room.releasedBy.includes(room.decodeEngine)
  );
}

/** The aborts waiting for their rooms' releases: who asked first, by room. */
export type AbortsState = ReadonlyMap<string, string>;

export type AbortInput =
  /** A committed event of the room, already folded into `room`. */
  | { kind: 'committed'; room: Room; event: JournalEvent }
  /** The grace period of the room's abort is over; `room` as folded now (undefined: it left the view). */
  | { kind: 'grace_over'; room: string; now: Room | undefined }
  /** The room ended, however. */
  | { kind: 'ended'; room: string };

export type AbortCommand =
  | { kind: 'start_grace'; room: string }
  | { kind: 'cancel_grace'; room: string }
  /** Journal `room.aborted`: `reason` the first request's, `source` who asked. */
  | { kind: 'append_aborted'; room: string; reason: string; source: string };

/** One input: the next state, and what to do. */
export function decideAbort(
  s: AbortsState,
  input: AbortInput,
): { state: AbortsState; commands: AbortCommand[] } {
  if (input.kind === 'ended') {
    if (!s.has(input.room)) return { state: s, commands: [] };
    return {
      state: without(s, input.room),
      commands: [{ kind: 'cancel_grace', room: input.room }],
    };
  }
  if (input.kind === 'grace_over') {
    // The abort stays pending until the room ends: a release still on its way finishes it too,
    // under the same event id.
    const source = s.get(input.room);
    const r = input.now;
    if (source === undefined || !r || isTerminal(r.state)) return { state: s, commands: [] };
    return { state: s, commands: [aborted(r, source)] };
  }
  const { room, event } = input;
  // Only the first request of a room starts the grace (later ones are idempotent).
  if (event.type === 'room.abort_requested' && room.abortRequestedAt === event.ts) {
    return {
      state: new Map(s).set(room.room, event.source),
      commands: [{ kind: 'start_grace', room: room.room }],
    };
  }
  if (
    event.type === 'room.released' &&
    room.abortRequestedAt !== null &&
    !isTerminal(room.state) &&
    releasedByBoth(room)
  )
    return { state: s, commands: [aborted(room, s.get(room.room) ?? 'control')] };
  return { state: s, commands: [] };
}

function aborted(room: Room, source: string): AbortCommand {
  return {
    kind: 'append_aborted',
    room: room.room,
    reason: room.abortReason ?? 'abort_requested',
    source,
  };
}

function without(s: AbortsState, room: string): AbortsState {
  const next = new Map(s);
  next.delete(room);
  return next;
}

/** Runs `decideAbort` on the committed events the control plane feeds it. */
export class Aborts {
  private state: AbortsState = new Map();
  private readonly timers = new Map<string, Timer>();

  constructor(
    private readonly journal: JournalLog,
    /** The room as the control plane has folded it now; undefined once it left the view. */
    private readonly roomNow: (room: string) => Room | undefined,
    private readonly log: Logger,
    /** How long after the request the room is aborted even without both releases. */
    private readonly graceMs = 2000,
    private readonly clock: Clock = systemClock,
  ) {}

  /** Journals the AbortReq; engines stop and release, then the room is marked aborted. */
  request(room: string, reason: string, source: string): Promise<AppendResult> {
    return this.journal.append({ type: 'room.abort_requested', room, source, data: { reason } });
  }

  /** A committed event of `room` (already folded into it): starts the grace, or finishes the abort. */
  onCommitted(room: Room, event: JournalEvent): void {
    this.run({ kind: 'committed', room, event });
  }

  /** The room ended (however): nothing is pending for it any more. */
  onTerminal(room: string): void {
    this.run({ kind: 'ended', room });
  }

  close(): void {
    for (const t of this.timers.values()) this.clock.clear(t);
    this.timers.clear();
  }

  private run(input: AbortInput): void {
    const decided = decideAbort(this.state, input);
    this.state = decided.state;
    for (const c of decided.commands) {
      if (c.kind === 'start_grace') {
        const timer = this.clock.setTimeout(() => {
          this.timers.delete(c.room);
          this.run({ kind: 'grace_over', room: c.room, now: this.roomNow(c.room) });
        }, this.graceMs);
        timer.unref();
        this.timers.set(c.room, timer);
      } else if (c.kind === 'cancel_grace') {
        this.clock.clear(this.timers.get(c.room));
        this.timers.delete(c.room);
      } else this.appendAborted(c);
    }
  }

  private appendAborted(c: Extract<AbortCommand, { kind: 'append_aborted' }>): void {
    this.journal
      .append({
        type: 'room.aborted',
        room: c.room,
        source: 'control',
        // One id per room: the grace timer and the last release may both get here.
        eventId: `${c.room}:aborted`,
        data: { reason: c.reason, source: c.source },
      })
      .catch((err) => this.log.error({ err, room: c.room }, 'could not journal room.aborted'));
  }
}
