/**
 * Counting and logging of frames that were dropped or nacked. Every reason is a counter (exposed
 * in heartbeats and metrics); logs are rate-limited per reason so that a flood of garbage cannot
 * flood the log or slow the loop that receives it.
 */
import type { Logger } from '../log.ts';
import { type Clock, systemClock } from '../ports/clock.ts';
import type { DropReason } from './protocol.ts';

export class DropCounters {
  private readonly counts = new Map<DropReason, number>();
  private readonly lastLog = new Map<DropReason, number>();
  private readonly suppressed = new Map<DropReason, number>();

  constructor(
    private readonly log: Logger,
    private readonly where: string,
    private readonly clock: Clock = systemClock,
    /** At most one log line per reason per this many ms. */
    private readonly logEveryMs = 5_000,
  ) {}

  record(reason: DropReason, context: Record<string, unknown>): void {
    this.counts.set(reason, (this.counts.get(reason) ?? 0) + 1);
    const now = this.clock.now();
    const last = this.lastLog.get(reason) ?? 0;
    if (now - last < this.logEveryMs) {
      this.suppressed.set(reason, (this.suppressed.get(reason) ?? 0) + 1);
      return;
    }
    this.lastLog.set(reason, now);
    const suppressed = this.suppressed.get(reason) ?? 0;
    this.suppressed.set(reason, 0);
    this.log.warn(
      { ...context, reason, total: this.counts.get(reason), suppressed },
      `${this.where}: dropped a bus message (${reason})`,
    );
  }

  get(reason: DropReason): number {
    return this.counts.get(reason) ?? 0;
  }

  snapshot(): Partial<Record<DropReason, number>> {
    return Object.fromEntries(this.counts) as Partial<Record<DropReason, number>>;
  }
}
