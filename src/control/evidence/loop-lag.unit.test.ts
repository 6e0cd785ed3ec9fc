import { describe, expect, it } from 'vitest';
import { systemClock } from '../../ports/clock.ts';
import { LoopLag } from './loop-lag.ts';

describe('LoopLag', () => {
  it('notes when its timer ran late, and by how much', () => {
    const lag = new LoopLag(systemClock, 25, 100);
    lag.tick(0);
    lag.tick(25);
    lag.tick(140); // 90 ms late: within the slack
    expect(lag.lateAt).toBe(0);
    lag.tick(700); // 535 ms late: the loop was blocked
    expect(lag.lateAt).toBe(700);
    expect(lag.worstMs).toBe(535);
    lag.tick(725);
    expect(lag.lateAt).toBe(700);
  });
});
