import { describe, expect, it } from 'vitest';
import { silentLogger } from '../log.ts';
import type { EventInput } from '../room/events.ts';
import { RefusalLog } from './refusals.ts';

/** A journal's append that refuses writes while `down` (a full disk), and keeps what it took. */
function journal() {
  const written: EventInput[] = [];
  const j = {
    down: false,
    tries: 0,
    written,
    append: async (ev: EventInput) => {
      j.tries++;
      if (j.down) throw new Error('the journal refuses writes');
      written.push(ev);
    },
  };
  return j;
}

const data = (ev: EventInput) => ev.data as { count: number; requestIds: string[] };

describe('RefusalLog', () => {
  it('writes a batch once it holds 20 ids, so every id of a burst is kept', async () => {
    const j = journal();
    const log = new RefusalLog(j.append, silentLogger, 60_000);
    for (let i = 1; i <= 45; i++) log.note('overloaded', 429, `r-${i}`, 'no pages', i);
    await new Promise((r) => setImmediate(r));
    // The two full batches went without waiting out the minute; the third waits for it.
    expect(j.written.map((e) => data(e).requestIds.length)).toEqual([20, 20]);
    await log.close();
    expect(j.written.map((e) => data(e).requestIds.length)).toEqual([20, 20, 5]);
    expect(j.written.flatMap((e) => data(e).requestIds)).toEqual(
      Array.from({ length: 45 }, (_, i) => `r-${i + 1}`),
    );
  });

  it('while the journal refuses writes, batches wait in order; past the cap only counts are kept', async () => {
    const j = journal();
    j.down = true;
    const log = new RefusalLog(j.append, silentLogger, 60_000, 50);
    for (let i = 1; i <= 140; i++) log.note('journal_unavailable', 503, `r-${i}`, 'down', i);
    await new Promise((r) => setImmediate(r));
    // The first full batch was tried and refused; the next ones wait for the timer, not one try
    // (and one warning) per batch as they fill.
    expect(j.tries).toBe(1);
    j.down = false;
    await log.close();
    const ids = j.written.flatMap((e) => data(e).requestIds);
    expect(ids).toEqual(Array.from({ length: 50 }, (_, i) => `r-${i + 1}`));
    expect(j.written.reduce((n, e) => n + data(e).count, 0)).toBe(140);
    // The refusals past the cap are on the record as a count beyond the event's ids.
    expect(j.written.some((e) => data(e).count > data(e).requestIds.length)).toBe(true);
  });
});
