import { describe, expect, it } from 'vitest';
import type { Logger } from '../log.ts';
import { SupervisedLoop } from './loop.ts';

describe('supervised loop', () => {
  it('restarts a body that throws or returns, counts it, and stops when told', async () => {
    const lines: string[] = [];
    const log: Logger = { debug() {}, info() {}, warn() {}, error: (_o, m) => lines.push(m) };
    let runs = 0;
    const loop = new SupervisedLoop(
      'test',
      async (l) => {
        runs++;
        l.tick();
        if (runs === 1) throw new Error('an unhandled ABORT frame');
        if (runs === 2) return;
        while (l.shouldRun) await new Promise((r) => setTimeout(r, 5));
      },
      log,
      1,
    );
    loop.start();
    while (runs < 3) await new Promise((r) => setTimeout(r, 5));
    expect(loop.stats()).toEqual({ ticks: 3, restarts: 2, running: true });
    expect(lines).toEqual([
      'loop test died; restarting it',
      'loop test returned while it should run; restarting it',
    ]);
    await loop.stop();
    expect(loop.stats().running).toBe(false);
  });
});
