/**
 * The watchdog's first rung (docs/design.md §9): every live room has a deadline for the state it is in;
 * a room that overstays is failed — `room.failed` with `reason: deadline_exceeded`, the `stage` it
 * was stuck in and `detectedBy: watchdog` — and the action is journaled as `recovery.action` with
 * how late it was noticed. Engines free the room's pages when the failure reaches them. So every
 * room reaches a terminal state in bounded time, whatever else fails. While the journal refuses
 * writes the failure cannot be recorded: the client's stream is ended at once all the same (503,
 * `room_unavailable`), and the failure is appended again every tick until the journal takes it.
 */
import type { ControlPlane } from '../control/control-plane.ts';
import type { JournalLog } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { type Clock, systemClock, type Timer } from '../ports/clock.ts';
import type { Room } from '../room/reducer.ts';

export interface WatchdogStats {
  ticks: number;
  /** Rooms failed for overstaying, since start. */
  failed: number;
  /** The last detection delay: deadline passed → noticed, in ms. */
  lastDetectMs: number | null;
  /** Clients answered for an overdue room whose failure the journal could not take at the time. */
  endedUnrecorded: number;
}

/** A room past its state's deadline, and what the watchdog does with it. */
export interface Overdue {
  room: Room;
  /** How long after its deadline it was noticed, in ms. */
  lateMs: number;
  /** The deadline of the state it overstayed, in ms. */
  allowedMs: number;
}

/**
 * The watchdog's decision at one tick (issue 41: decided apart from done): the live rooms past
 * their state's deadline at `now`, but for those whose failure is already on its way to the
 * journal. A pure function of what it is given; `Watchdog` appends the failures.
 */
export function decideOverdue(
  rooms: Iterable<Room>,
  now: number,
  failing: ReadonlySet<string>,
): Overdue[] {
  const out: Overdue[] = [];
  for (const room of rooms) {
    if (room.deadlineAt === null || room.deadlineAt > now || failing.has(room.room)) continue;
    const allowedMs = room.deadlinesMs[room.state as keyof Room['deadlinesMs']];
    out.push({ room, lateMs: now - room.deadlineAt, allowedMs });
  }
  return out;
}

export class Watchdog {
  private timer: Timer | null = null;
  /** Rooms whose failure was appended and not yet seen committed. */
  private readonly failing = new Set<string>();
  readonly stats: WatchdogStats = { ticks: 0, failed: 0, lastDetectMs: null, endedUnrecorded: 0 };
  private unjournaledLoggedAt = 0;
  private unjournaledNotLogged = 0;

  constructor(
    /** The rooms it watches, and the client it answers when the journal cannot take a failure. */
    private readonly control: Pick<ControlPlane, 'liveRooms' | 'endUnrecorded'>,
    private readonly journal: Pick<JournalLog, 'append'>,
    private readonly log: Logger,
    /** How often rooms are checked. Default 100 ms: detection within a tick of the deadline. */
    private readonly intervalMs = 100,
    private readonly clock: Clock = systemClock,
  ) {}

  start(): void {
    if (this.timer) return;
    this.timer = this.clock.setInterval(() => this.tick(), this.intervalMs).unref();
  }

  stop(): void {
    this.clock.clear(this.timer);
    this.timer = null;
  }

  /** One pass over the live rooms; returns the rooms it failed. */
  tick(now = this.clock.now()): string[] {
    this.stats.ticks++;
    const overdue = decideOverdue(this.control.liveRooms(), now, this.failing);
    for (const o of overdue) this.fail(o);
    return overdue.map((o) => o.room.room);
  }

  private fail({ room, lateMs: late, allowedMs: allowed }: Overdue): void {
    this.failing.add(room.room);
    this.stats.failed++;
    this.stats.lastDetectMs = late;
    this.log.warn(
      {
        room: room.room,
        stage: room.state,
        overMs: late,
        prefill: room.prefillEngine,
        decode: room.decodeEngine,
      },
      'room overstayed its state; failing it',
    );
    const journal = this.journal;
    // One id per room and state: a second tick before the first commit appends nothing new.
    journal
      .append({
        type: 'room.failed',
        room: room.room,
        source: 'watchdog',
        eventId: `${room.room}:deadline:${room.state}`,
        data: { reason: 'deadline_exceeded', stage: room.state, detectedBy: 'watchdog' },
      })
      .then(() =>
        journal.append({
          type: 'recovery.action',
          room: room.room,
          source: 'watchdog',
          data: {
            action: 'fail_overdue_room',
            reason: `${room.state} for longer than its ${allowed} ms deadline`,
            outcome: 'room failed',
            detectMs: late,
            stage: room.state,
          },
        }),
      )
      .catch((err) => {
        // The client is not kept waiting for the journal to come back.
        if (
          this.control.endUnrecorded(
            room.room,
            `${room.state} overstayed its ${allowed} ms deadline and the journal cannot record that now (${(err as Error).message}); it will be failed in the journal once it can be written`,
          )
        ) {
          this.stats.endedUnrecorded++;
        }
        // While the journal is down every tick fails again: one line per 5 s, with the count.
        const at = this.clock.now();
        if (at - this.unjournaledLoggedAt < 5000) {
          this.unjournaledNotLogged++;
          return;
        }
        this.log.error(
          { err, room: room.room, alsoFailedNotLogged: this.unjournaledNotLogged },
          'watchdog could not journal the failure; will retry',
        );
        this.unjournaledLoggedAt = at;
        this.unjournaledNotLogged = 0;
      })
      .finally(() => this.failing.delete(room.room));
  }
}
