/**
 * A simulated process's life (issue 41, the process lifecycle port): its own view of the fleet's
 * virtual clock, through which every timer and deferred callback of the process goes, so that the
 * simulator can do to it what a signal does to a real one —
 *
 * - `kill` (SIGKILL): nothing of the process runs again; its timers are dropped;
 * - `freeze` (SIGSTOP): nothing runs while frozen; timers that fall due wait, and `thaw` (SIGCONT)
 *   runs them, in order, at once — as a process that was stopped finds its timers overdue.
 *
 * Its sockets are the network's business (`MemoryNetwork.kill`, partitions while frozen).
 */
import type { Clock, Timer } from '../ports/clock.ts';
import type { VirtualClock } from './world/clock.ts';

export class ProcessClock implements Clock {
  private readonly timers = new Set<Timer>();
  private dead = false;
  private frozen = false;
  /** Callbacks that fell due while frozen, in the order they did. */
  private readonly overdue: Array<() => void> = [];

  constructor(private readonly base: VirtualClock) {}

  get alive(): boolean {
    return !this.dead;
  }

  now(): number {
    return this.base.now();
  }

  monotonic(): number {
    return this.base.monotonic();
  }

  setTimeout(fn: () => void, ms: number): Timer {
    if (this.dead) return DEAD_TIMER;
    const t: Timer = this.base.setTimeout(() => {
      this.timers.delete(t);
      this.run(fn);
    }, ms);
    this.timers.add(t);
    return t;
  }

  setInterval(fn: () => void, ms: number): Timer {
    if (this.dead) return DEAD_TIMER;
    let due = false;
    const t = this.base.setInterval(() => {
      // A stopped process's interval fires once when it goes on, not once per missed period.
      if (this.frozen) {
        if (!due)
          this.overdue.push(() => {
            due = false;
            fn();
          });
        due = true;
        return;
      }
      if (!this.dead) fn();
    }, ms);
    this.timers.add(t);
    return t;
  }

  defer(fn: () => void): void {
    if (this.dead) return;
    this.base.defer(() => this.run(fn));
  }

  clear(timer: Timer | undefined | null): void {
    if (!timer) return;
    this.timers.delete(timer);
    this.base.clear(timer);
  }

  private run(fn: () => void): void {
    if (this.dead) return;
    if (this.frozen) this.overdue.push(fn);
    else fn();
  }

  kill(): void {
    this.dead = true;
    for (const t of this.timers) this.base.clear(t);
    this.timers.clear();
    this.overdue.length = 0;
  }

  freeze(): void {
    if (!this.dead) this.frozen = true;
  }

  thaw(): void {
    if (!this.frozen) return;
    this.frozen = false;
    for (const fn of this.overdue.splice(0)) this.base.defer(() => this.run(fn));
  }
}

const DEAD_TIMER: Timer = { unref: () => DEAD_TIMER };
