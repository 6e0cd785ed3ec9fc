/**
 * The abort workflow (docs/design.md §2): an AbortReq is journaled as `room.abort_requested`; the
 * engines stop the room and each journals `room.released`; once both have released — or after a
 * grace period, for an engine that never answers — the room is journaled `room.aborted`, with the
 * reason of the first request and who asked. The control plane feeds committed events in; this
 * module owns the grace timers.
 */
import type { JournalEvent } from '../journal/events.ts';
import type { Room } from '../journal/reducer.ts';
import { isTerminal } from '../journal/states.ts';
import type { AppendResult, JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { type Clock, systemClock, type Timer } from '../ports/clock.ts';

/** Both engines of the room's pair have journaled `room.released`. */
export function releasedByBoth(room: Room): boolean {
  return (
    room.releasedBy.includes(room.prefillEngine) && room.releasedBy.includes(room.decodeEngine)
  );
}

export class Aborts {
  private readonly timers = new Map<string, Timer>();
  /** Who asked for each pending abort (the `source` of its room.abort_requested). */
  private readonly sources = new Map<string, string>();

  constructor(
    private readonly journal: JournalStore,
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
  onCommitted(room: Room, ev: JournalEvent): void {
    // Only the first request of a room starts the grace (later ones are idempotent).
    if (ev.type === 'room.abort_requested' && room.abortRequestedAt === ev.ts)
      this.schedule(room, ev);
    if (ev.type === 'room.released' && room.abortRequestedAt !== null && !isTerminal(room.state))
      if (releasedByBoth(room)) this.appendAborted(room, this.sources.get(room.room) ?? 'control');
  }

  /** The room ended (however): nothing is pending for it any more. */
  onTerminal(room: string): void {
    this.clock.clear(this.timers.get(room));
    this.timers.delete(room);
    this.sources.delete(room);
  }

  close(): void {
    for (const t of this.timers.values()) this.clock.clear(t);
    this.timers.clear();
  }

  private schedule(room: Room, ev: JournalEvent): void {
    const source = ev.source;
    const timer = this.clock.setTimeout(() => {
      this.timers.delete(room.room);
      const now = this.roomNow(room.room);
      if (now && !isTerminal(now.state)) this.appendAborted(now, source);
    }, this.graceMs);
    timer.unref();
    this.timers.set(room.room, timer);
    this.sources.set(room.room, source);
  }

  private appendAborted(room: Room, source: string): void {
    this.journal
      .append({
        type: 'room.aborted',
        room: room.room,
        source: 'control',
        // One id per room: the grace timer and the last release may both get here.
        eventId: `${room.room}:aborted`,
        data: { reason: room.abortReason ?? 'abort_requested', source },
      })
      .catch((err) => this.log.error({ err, room: room.room }, 'could not journal room.aborted'));
  }
}
