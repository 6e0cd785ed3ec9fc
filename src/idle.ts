import { type Clock, systemClock } from './ports/clock.ts';

/** Waiting for "nothing left in flight" (a drain): each waiter ends at the signal or its timeout. */
export class IdleWaiters {
  private waiters: Array<() => void> = [];

  constructor(private readonly clock: Clock = systemClock) {}

  /** Resolves true when `fire()` is called, false once `ms` passed first. */
  wait(ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const done = () => {
        this.clock.clear(timer);
        resolve(true);
      };
      const timer = this.clock.setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== done);
        resolve(false);
      }, ms);
      this.waiters.push(done);
    });
  }

  /** Nothing is in flight now: every waiter resolves true. */
  fire(): void {
    for (const w of this.waiters.splice(0)) w();
  }
}
