/**
 * Whether the control plane itself was too busy to hear its engines. Every stall detector reads
 * time between messages (heartbeats, events applied, work ticks) on the control plane's clock; a
 * control plane whose own event loop was blocked — a burst of frames drained in one go, a long
 * synchronous task — reads them late, and would blame a healthy engine. A timer that runs every
 * `everyMs` and notes when it ran late gives the detectors the last moment the control plane was
 * not listening: evidence against an engine counts only from then on (stalls.ts).
 */
import { type Clock, systemClock, type Timer } from '../../ports/clock.ts';

export class LoopLag {
  /** The last time (unix ms) the loop was seen blocked for longer than `lateMs`; 0: never. */
  lateAt = 0;
  /** The longest block seen, in ms (for logs and tests). */
  worstMs = 0;
  private timer: Timer | null = null;
  private last = 0;

  constructor(
    private readonly clock: Clock = systemClock,
    private readonly everyMs = 25,
    private readonly lateMs = 100,
  ) {}

  start(): void {
    if (this.timer) return;
    this.last = this.clock.now();
    this.timer = this.clock.setInterval(() => this.tick(this.clock.now()), this.everyMs).unref();
  }

  /** One timer run at `now`: late if it came more than `lateMs` after it was due. */
  tick(now: number): void {
    const late = now - this.last - this.everyMs;
    this.last = now;
    if (late > this.lateMs) {
      this.lateAt = now;
      this.worstMs = Math.max(this.worstMs, late);
    }
  }

  stop(): void {
    this.clock.clear(this.timer);
    this.timer = null;
  }
}
