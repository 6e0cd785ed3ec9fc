import { describe, expect, it } from 'vitest';
import { markerRows } from './html.ts';
import { type DrillReport, nextCommands, type StateSample, waitingFigures } from './report.ts';

const at = (atMs: number, waiting: number): StateSample => ({
  atMs,
  live: waiting > 0 ? { waiting } : {},
  terminal: {},
});

describe('a drill report in numbers', () => {
  it('says how many requests waited with no room, how long, and the longest stretch', () => {
    const samples = [at(0, 0), at(100, 2), at(200, 5), at(300, 0), at(400, 1), at(500, 0)];
    expect(waitingFigures(samples)).toEqual({
      peak: 5,
      ms: 300,
      longest: { fromMs: 100, toMs: 300 },
    });
    expect(waitingFigures([at(0, 0), at(100, 0)])).toBeNull();
  });

  it('stacks the numbers of markers close in time instead of printing them over each other', () => {
    // Five markers within a few pixels, then one far off: five rows, then back to the first.
    expect(markerRows([100, 103, 106, 109, 112, 400])).toEqual([0, 1, 2, 3, 4, 0]);
    expect(markerRows([100, 130, 160])).toEqual([0, 0, 0]);
  });

  it('names what to run next: the window in the journal, then what takes each engine back', () => {
    const r = {
      journal: '/data/journal.db',
      url: null,
      startedAt: Date.parse('2026-12-07T03:00:00Z'),
      leftBehind: [
        {
          engine: 'decode-1',
          what: 'cordoned by the ladder: relapsed',
          undo: 'pdctl engines uncordon decode-1',
        },
        { engine: 'prefill-0', what: 'ejected as an outlier: 3 of 3 failed', undo: null },
      ],
    } as unknown as DrillReport;
    expect(nextCommands(r)).toEqual([
      'pdctl rooms --journal /data/journal.db --since 2026-12-07T03:00:00.000Z --state failed,migrated,aborted',
      'pdctl journal tail --journal /data/journal.db --since 2026-12-07T03:00:00.000Z --type engine,recovery',
      'pdctl engines uncordon decode-1 --url URL',
    ]);
    expect(nextCommands({ ...r, url: 'http://10.0.0.1:8080' })[2]).toBe(
      'pdctl engines uncordon decode-1 --url http://10.0.0.1:8080',
    );
  });
});
