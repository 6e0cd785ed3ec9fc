import { describe, expect, it } from 'vitest';
import { systemClock } from './clock.ts';

describe('systemClock', () => {
  it('is the process clock: a real timeout fires, a cleared one does not', async () => {
    expect(Math.abs(systemClock.now() - Date.now())).toBeLessThan(1000);
    const t0 = systemClock.monotonic();
    let cleared = false;
    const t = systemClock.setTimeout(() => {
      cleared = true;
    }, 1);
    systemClock.clear(t);
    await new Promise<void>((r) => systemClock.setTimeout(r, 5).unref());
    expect(cleared).toBe(false);
    expect(systemClock.monotonic()).toBeGreaterThan(t0);
  });
});
