/**
 * The clock port (issue 41): what a module needs of time — the wall clock for journal
 * timestamps, a monotonic clock for durations, and timers — behind one interface with two
 * adapters. `systemClock` is the process's own; `VirtualClock` (src/sim/world/clock.ts) is the simulator's, where time
 * moves only when the caller advances it and timers fire in a fixed order, so a run is a pure
 * function of its seed. A module takes a `Clock` instead of calling `Date.now()`, `setTimeout`
 * or `performance.now()` itself.
 */
import { performance } from 'node:perf_hooks';

/** A scheduled timer; `unref` lets the process exit while it is pending (no-op when virtual). */
export interface Timer {
  unref(): Timer;
}

export interface Clock {
  /** Wall-clock milliseconds since the Unix epoch (what the journal's `ts` records). */
  now(): number;
  /** Monotonic milliseconds, for durations: never goes back. */
  monotonic(): number;
  setTimeout(fn: () => void, ms: number): Timer;
  setInterval(fn: () => void, ms: number): Timer;
  /**
   * Runs `fn` on the next turn, after the I/O of this one (Node's `setImmediate`): how a module
   * yields without waiting. Virtual: due now, after every timer already due now.
   */
  defer(fn: () => void): void;
  /** Cancels a timeout or an interval; a timer already fired or cleared is ignored. */
  clear(timer: Timer | undefined | null): void;
}

/** Times async steps by name on `clock`: `await time('bookMs', () => …)`; `took` holds each. */
export function stepTimer(clock: Clock): {
  took: Record<string, number>;
  time<T>(name: string, f: () => Promise<T>): Promise<T>;
} {
  const took: Record<string, number> = {};
  return {
    took,
    async time(name, f) {
      const t0 = clock.monotonic();
      try {
        return await f();
      } finally {
        took[name] = Math.round(clock.monotonic() - t0);
      }
    },
  };
}

/** The process's clock: Date.now(), performance.now() and Node's timers. */
export const systemClock: Clock = Object.freeze({
  now: () => Date.now(),
  monotonic: () => performance.now(),
  setTimeout: (fn: () => void, ms: number): Timer => setTimeout(fn, ms),
  setInterval: (fn: () => void, ms: number): Timer => setInterval(fn, ms),
  defer: (fn: () => void) => void setImmediate(fn),
  clear: (timer: Timer | undefined | null) => {
    if (timer) clearTimeout(timer as NodeJS.Timeout);
  },
});
