/**
 * `pdctl plan --journal FILE`: a past record replayed through the planner, interval by interval,
 * saying what it would have proposed and why — against the fleet the journal shows at each
 * interval, starting and stopping nothing.
 */
import type { EventType, JournalEvent } from '../journal/events.ts';
import { eachEvent, type JournalReader } from '../journal/store.ts';
import { type Decision, decide, freshMemory, type PlannerConfig } from './model.ts';
import { WindowRecord } from './record.ts';

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
  /** Null: the largest fleet the journal shows (engines registered and not exited). */
  budget: number | null;
  config: Omit<PlannerConfig, 'budget'>;
  /** Unix ms; only intervals that end after `since` and start before `until` are decided. */
  since?: number;
  until?: number;
  /** Called once per interval decided, in order. */
  onDecision: (d: Decision) => void;
}

/** Replays the journal; returns how many intervals it decided. */
export async function replayPlanner(
  reader: Pick<JournalReader, 'tail'>,
  opts: ReplayOptions,
): Promise<number> {
  let record: WindowRecord | null = null;
  let windowEnd = 0;
  let lastTs = 0;
  let largest = 0;
  let decided = 0;
  const memory = freshMemory();
  const decideUntil = (to: number) => {
    if (!record) return;
    const fleet = record.engines();
    const summary = record.close(to);
    if (opts.since !== undefined && summary.to <= opts.since) return;
    if (opts.until !== undefined && summary.from >= opts.until) return;
    const budget = opts.budget ?? Math.max(largest, fleet.prefill + fleet.decode, 2);
    opts.onDecision(decide(summary, fleet, { ...opts.config, budget }, memory));
    decided++;
  };
  await eachEvent(reader, { type: [...PLANNER_EVENTS] }, (ev: JournalEvent) => {
    if (opts.until !== undefined && ev.ts >= opts.until + opts.intervalMs) return false;
    if (!record) {
      const from = Math.floor(ev.ts / opts.intervalMs) * opts.intervalMs;
      record = new WindowRecord(from);
      windowEnd = from + opts.intervalMs;
    }
    for (; ev.ts >= windowEnd; windowEnd += opts.intervalMs) decideUntil(windowEnd);
    record.fold(ev);
    lastTs = Math.max(lastTs, ev.ts);
    const fleet = record.engines();
    largest = Math.max(largest, fleet.prefill + fleet.decode);
    return true;
  });
  // The last interval, as far as the record goes, if that is half an interval or more: rates over
  // a sliver of time say nothing.
  if (lastTs + 1 - (windowEnd - opts.intervalMs) >= opts.intervalMs / 2) decideUntil(lastTs + 1);
  return decided;
}
