import { describe, expect, it } from 'vitest';
import { VirtualClock } from './clock.ts';

describe('VirtualClock', () => {
  it('moves only when advanced, and fires what falls due in order of due time, then of setting', () => {
    const clock = new VirtualClock(1_000_000);
    const fired: string[] = [];
    clock.setTimeout(() => fired.push(`b@${clock.now()}`), 20);
    clock.setTimeout(() => fired.push(`a@${clock.now()}`), 10);
    clock.setTimeout(() => fired.push(`c@${clock.now()}`), 20);
    expect(clock.now()).toBe(1_000_000);
    expect(clock.advance(15)).toBe(1);
    expect(fired).toEqual(['a@1000010']);
    expect(clock.now()).toBe(1_000_015);
    expect(clock.monotonic()).toBe(15);
    clock.advance(100);
    expect(fired).toEqual(['a@1000010', 'b@1000020', 'c@1000020']);
    expect(clock.pending).toBe(0);
  });

  it('fires in the same advance a timer set by a timer, when it is due within the window', () => {
    const clock = new VirtualClock(0);
    const fired: number[] = [];
    clock.setTimeout(() => {
      fired.push(clock.now());
      clock.setTimeout(() => fired.push(clock.now()), 5);
      clock.setTimeout(() => fired.push(clock.now()), 50);
    }, 10);
    clock.advance(20);
    expect(fired).toEqual([10, 15]);
    expect(clock.nextAt()).toBe(60);
    expect(clock.runNext()).toBe(true);
    expect(fired).toEqual([10, 15, 60]);
    expect(clock.runNext()).toBe(false);
  });

  it('repeats an interval until cleared, and ignores clearing what already fired', () => {
    const clock = new VirtualClock(0);
    let ticks = 0;
    const every = clock.setInterval(() => ticks++, 100);
    const once = clock.setTimeout(() => {}, 1);
    clock.advance(350);
    expect(ticks).toBe(3);
    clock.clear(every);
    clock.clear(once);
    clock.clear(null);
    clock.advance(1000);
    expect(ticks).toBe(3);
    expect(clock.pending).toBe(0);
  });

  it('takes a delay as Node does: below 1 ms or not a number is 1 ms', () => {
    const clock = new VirtualClock(0);
    const at: number[] = [];
    for (const ms of [0, -5, Number.NaN, 2.7]) clock.setTimeout(() => at.push(clock.now()), ms);
    clock.advance(10);
    expect(at).toEqual([1, 1, 1, 2]);
    expect(() => clock.advance(-1)).toThrow(RangeError);
    expect(() => clock.advance(Number.POSITIVE_INFINITY)).toThrow(RangeError);
  });
});

describe('VirtualClock.step and defer', () => {
  it('fires one timer per step, a deferred callback after the timers already due now', () => {
    const clock = new VirtualClock(0);
    const fired: string[] = [];
    clock.setTimeout(() => {
      fired.push(`t@${clock.now()}`);
      clock.defer(() => fired.push(`deferred@${clock.now()}`));
      clock.setTimeout(() => fired.push(`later@${clock.now()}`), 1);
    }, 5);
    clock.setTimeout(() => fired.push(`u@${clock.now()}`), 5);
    expect(clock.step()).toBe(true);
    expect(fired).toEqual(['t@5']);
    clock.step();
    clock.step();
    expect(fired).toEqual(['t@5', 'u@5', 'deferred@5']);
    clock.step();
    expect(fired).toEqual(['t@5', 'u@5', 'deferred@5', 'later@6']);
    expect(clock.step()).toBe(false);
  });
});
