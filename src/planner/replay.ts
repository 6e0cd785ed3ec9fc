/**
 * `pdctl plan --journal FILE`: a past record replayed through the planner, interval by interval,
 * saying what it would have proposed and why — against the fleet the journal shows at each
 * interval, starting and stopping nothing. `pdctl plan --trace FILE`: a trace's requests, as the
 * events serving them would have made (trace.ts), with a fleet that follows the proposals.
 */

import type { EventType, JournalEvent } from '../room/events.ts';
import { type Decision, decide, freshMemory, type PlannerConfig } from './model.ts';
import { type Fleet, WindowRecord } from './record.ts';

/** The event types the record folds (record.ts). */
export const PLANNER_EVENTS: readonly EventType[] = [
  'engine.registered',
  'engine.exited',
  'request.refused',
  'room.created',
  'room.prefill_started',
  'room.transfer_posted',
  'room.decode_started',
  'room.completed',
  'room.failed',
  'room.aborted',
  'room.migrated',
];

export interface ReplayOptions {
  intervalMs: number;
  /** Null: the largest fleet the record shows (engines registered and not exited). */
  budget: number | null;
  config: Omit<PlannerConfig, 'budget'>;
  /** Unix ms; only intervals that end after `since` and start before `until` are decided. */
  since?: number;
  until?: number;
  /**
   * A fleet that follows the proposals, from this one, as `--planner act` would move it (a trace
   * has no fleet of its own); absent: the fleet the record shows, which nobody moves.
   */
  follow?: Fleet;
  /** Called once per interval decided, in order. */
  onDecision: (d: Decision) => void;
}

/**
 * Replays a journal's events of `PLANNER_EVENTS`, oldest first, page by page (the journal's
 * `eventPages`); returns how many intervals it decided.
 */
export async function replayPlanner(
  pages: AsyncIterable<readonly JournalEvent[]>,
  opts: ReplayOptions,
): Promise<number> {
  const replay = new Replay(opts);
  read: for await (const page of pages) for (const ev of page) if (!replay.fold(ev)) break read;
  return replay.finish();
}

/** Replays events in time order (a trace's: trace.ts `traceEvents`); returns the intervals decided. */
export function replayEvents(events: Iterable<JournalEvent>, opts: ReplayOptions): number {
  const replay = new Replay(opts);
  for (const ev of events) if (!replay.fold(ev)) break;
  return replay.finish();
}

/** The record cut into intervals by the events' time, each decided as it ends. */
class Replay {
  private record: WindowRecord | null = null;
  private windowEnd = 0;
  private lastTs = 0;
  private largest = 0;
  private decided = 0;
  private readonly memory = freshMemory();
  private fleet: Fleet | null;

  constructor(private readonly opts: ReplayOptions) {
    this.fleet = opts.follow ? { ...opts.follow } : null;
  }

  /** False once the events are past `until`. */
  fold(ev: JournalEvent): boolean {
    const { intervalMs, until } = this.opts;
    if (until !== undefined && ev.ts >= until + intervalMs) return false;
    if (!this.record) {
      const from = Math.floor(ev.ts / intervalMs) * intervalMs;
      this.record = new WindowRecord(from);
      this.windowEnd = from + intervalMs;
    }
    for (; ev.ts >= this.windowEnd; this.windowEnd += intervalMs) this.decideUntil(this.windowEnd);
    this.record.fold(ev);
    this.lastTs = Math.max(this.lastTs, ev.ts);
    const fleet = this.record.engines();
    this.largest = Math.max(this.largest, fleet.prefill + fleet.decode);
    return true;
  }

  /** Decides the last interval, as far as the record goes, if that is half an interval or more: rates over a sliver of time say nothing. */
  finish(): number {
    const { intervalMs } = this.opts;
    if (this.record && this.lastTs + 1 - (this.windowEnd - intervalMs) >= intervalMs / 2)
      this.decideUntil(this.lastTs + 1);
    return this.decided;
  }

  private decideUntil(to: number): void {
    const record = this.record;
    if (!record) return;
    const fleet = this.fleet ?? record.engines();
    const summary = record.close(to);
    const { since, until, config } = this.opts;
    if (since !== undefined && summary.to <= since) return;
    if (until !== undefined && summary.from >= until) return;
    const budget = this.opts.budget ?? Math.max(this.largest, fleet.prefill + fleet.decode, 2);
    const d = decide(summary, fleet, { ...config, budget }, this.memory);
    if (this.fleet) {
      d.acted = d.proposal.prefill !== fleet.prefill || d.proposal.decode !== fleet.decode;
      this.fleet = { ...d.proposal };
    }
    this.opts.onDecision(d);
    this.decided++;
  }
}
