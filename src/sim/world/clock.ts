/**
 * The simulator's time (docs/simulation.md): a `Clock` (ports/clock.ts) that moves only when the
 * run tells it to, so that a seed gives the same schedule on every run.
 */
import type { Clock, Timer } from '../../ports/clock.ts';

interface Scheduled {
  at: number;
  /** Scheduling order: of timers due at the same time, the one set first fires first. */
  order: number;
  fn: () => void;
  /** Milliseconds between firings of an interval; null for a timeout. */
  every: number | null;
  handle: VirtualTimer;
}

class VirtualTimer implements Timer {
  cleared = false;
  unref(): Timer {
    return this;
  }
}

/**
 * Time that moves only when told. `advance(ms)` fires every timer due up to the new time in
 * order of due time, then of scheduling; a timer set while firing, due within the window, fires
 * in the same call. Timer callbacks that throw are not caught: a simulation stops at the first.
 */
export class VirtualClock implements Clock {
  private time: number;
  private readonly startedAt: number;
  /** A binary heap by (at, order); a cleared timer stays in it until it comes up, and is skipped. */
  private readonly heap: Scheduled[] = [];
  private live = 0;
  private nextOrder = 0;

  /** `start`: the wall-clock time the run begins at (a fixed one keeps traces comparable). */
  constructor(start = Date.UTC(2026, 0, 1)) {
    if (!Number.isFinite(start)) throw new RangeError(`start must be a finite time, got ${start}`);
    this.time = start;
    this.startedAt = start;
  }

  now(): number {
    return this.time;
  }

  monotonic(): number {
    return this.time - this.startedAt;
  }

  setTimeout(fn: () => void, ms: number): Timer {
    return this.schedule(fn, ms, null);
  }

  setInterval(fn: () => void, ms: number): Timer {
    return this.schedule(fn, ms, Math.max(1, delay(ms)));
  }

  defer(fn: () => void): void {
    const handle = new VirtualTimer();
    this.insert({ at: this.time, order: this.nextOrder++, fn, every: null, handle });
  }

  clear(timer: Timer | undefined | null): void {
    if (!(timer instanceof VirtualTimer) || timer.cleared) return;
    timer.cleared = true;
    this.live--;
  }

  /** Timers set and not yet fired or cleared. */
  get pending(): number {
    return this.live;
  }

  /** When the next timer is due; null when none is set. */
  nextAt(): number | null {
    return this.peek()?.at ?? null;
  }

  /** Moves time forward by `ms`, firing what falls due on the way; returns how many fired. */
  advance(ms: number): number {
    if (!(ms >= 0) || !Number.isFinite(ms))
      throw new RangeError(`advance takes a finite number of ms ≥ 0, got ${ms}`);
    const until = this.time + ms;
    let fired = 0;
    while ((this.peek()?.at ?? Number.POSITIVE_INFINITY) <= until) {
      this.step();
      fired++;
    }
    this.time = until;
    return fired;
  }

  /**
   * Fires the one timer due first, moving time to it; false when none is set. What a simulator
   * drives its run with: between two timers it lets the promises the first one settled run, as
   * Node does between two callbacks.
   */
  step(): boolean {
    const next = this.peek();
    if (!next) return false;
    this.pop();
    this.time = next.at;
    if (next.every !== null) {
      this.live--;
      this.insert({ ...next, at: next.at + next.every, order: this.nextOrder++ });
    } else {
      next.handle.cleared = true;
      this.live--;
    }
    next.fn();
    return true;
  }

  /**
   * Moves time forward by `ms` as a running process would see it: fires the timers due on the
   * way one at a time, and after each lets the promises it settled run (one turn of the real
   * event loop) before the next; returns how many fired. Everything of a simulated run is on
   * this clock, so nothing else is waiting in that turn.
   */
  async run(ms = 0): Promise<number> {
    if (!(ms >= 0) || !Number.isFinite(ms))
      throw new RangeError(`run takes a finite number of ms ≥ 0, got ${ms}`);
    const until = this.time + ms;
    let fired = 0;
    await turn();
    while ((this.peek()?.at ?? Number.POSITIVE_INFINITY) <= until) {
      this.step();
      fired++;
      await turn();
    }
    this.time = until;
    return fired;
  }

  /**
   * Runs the clock, one timer at a time with the promises between, until `promise` settles; then
   * settles as it did. Rejects when no timer is left to fire before it settles (nothing can ever
   * settle it: a deadlock of the simulated run), or once `limitMs` of virtual time has passed.
   */
  async runUntil<T>(promise: Promise<T>, limitMs = Number.POSITIVE_INFINITY): Promise<T> {
    let settled = false;
    const watched = promise.then(
      (v) => {
        settled = true;
        return v;
      },
      (err) => {
        settled = true;
        throw err;
      },
    );
    watched.catch(() => {});
    const until = this.time + limitMs;
    await turn();
    while (!settled) {
      const next = this.peek();
      if (!next)
        throw new Error('deadlock: nothing is left to run, and the awaited work never ended');
      if (next.at > until) throw new Error(`still waiting after ${limitMs} ms of virtual time`);
      this.step();
      await turn();
    }
    return watched;
  }

  /** Jumps to the next timer and fires everything due then; false when none is set. */
  runNext(): boolean {
    const at = this.nextAt();
    if (at === null) return false;
    this.advance(at - this.time);
    return true;
  }

  private schedule(fn: () => void, ms: number, every: number | null): Timer {
    const handle = new VirtualTimer();
    this.insert({ at: this.time + delay(ms), order: this.nextOrder++, fn, every, handle });
    return handle;
  }

  private insert(s: Scheduled): void {
    const h = this.heap;
    h.push(s);
    this.live++;
    for (let i = h.length - 1; i > 0; ) {
      const parent = (i - 1) >> 1;
      if (!before(s, h[parent] as Scheduled)) break;
      h[i] = h[parent] as Scheduled;
      h[parent] = s;
      i = parent;
    }
  }

  /** The timer due first, dropping cleared ones off the top. */
  private peek(): Scheduled | undefined {
    while (this.heap.length > 0 && (this.heap[0] as Scheduled).handle.cleared) this.pop();
    return this.heap[0];
  }

  private pop(): void {
    const h = this.heap;
    const last = h.pop() as Scheduled;
    if (h.length === 0) return;
    h[0] = last;
    for (let i = 0; ; ) {
      const l = 2 * i + 1;
      const r = l + 1;
      let least = i;
      if (l < h.length && before(h[l] as Scheduled, h[least] as Scheduled)) least = l;
      if (r < h.length && before(h[r] as Scheduled, h[least] as Scheduled)) least = r;
      if (least === i) break;
      h[i] = h[least] as Scheduled;
      h[least] = last;
      i = least;
    }
  }
}

/** Which of two timers fires first: the one due first, then the one set first. */
function before(a: Scheduled, b: Scheduled): boolean {
  return a.at < b.at || (a.at === b.at && a.order < b.order);
}

let turns = 0;

/**
 * Every promise settled so far has run its callbacks: a tick runs only once the microtask queue is
 * empty, which a turn of the event loop (its poll for I/O included) did at a higher cost — the
 * simulator runs about 3 % faster, the same trace. Every 64th turn is one of the real event loop,
 * so real I/O and timers (a test's timeout, a write to a pipe) still get theirs.
 */
function turn(): Promise<void> {
  if (++turns % 64 === 0) return new Promise((resolve) => setImmediate(resolve));
  return new Promise((resolve) => process.nextTick(resolve));
}

/** Node's rule for a delay: anything not a number ≥ 1 (NaN, negative, 0) is 1 ms. */
function delay(ms: number): number {
  return Number.isFinite(ms) && ms >= 1 ? Math.floor(ms) : 1;
}
