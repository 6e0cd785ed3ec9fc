/**
 * Listeners of one kind of news (committed room events, append latencies): added and removed,
 * each called in turn. One that throws is logged and the rest still hear it.
 */
import type { Logger } from '../log.ts';
import { type Clock, systemClock } from '../ports/clock.ts';

export class Listeners<A extends unknown[]> {
  private readonly all: Array<(...args: A) => void> = [];

  constructor(
    private readonly log: Logger,
    private readonly what: string,
  ) {}

  /** Adds a listener; returns what removes it. */
  add(listener: (...args: A) => void): () => void {
    this.all.push(listener);
    return () => {
      const i = this.all.indexOf(listener);
      if (i >= 0) this.all.splice(i, 1);
    };
  }

  emit(...args: A): void {
    for (const l of this.all) {
      try {
        l(...args);
      } catch (err) {
        this.log.error({ err }, `${this.what} threw`);
      }
    }
  }
}

/** Wraps promises so that each one's time to settle (ms) is told to `listeners` when it resolves. */
export function timing(
  listeners: Listeners<[ms: number]>,
  clock: Clock = systemClock,
): <T>(p: Promise<T>) => Promise<T> {
  return <T>(p: Promise<T>) => {
    const t0 = clock.monotonic();
    return p.then((v) => {
      listeners.emit(clock.monotonic() - t0);
      return v;
    });
  };
}
