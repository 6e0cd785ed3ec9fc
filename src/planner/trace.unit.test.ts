/** The trace reader (src/planner/trace.ts): the Mooncake format, bad lines, the reuse bound. */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { tempDir } from '../../test/helpers/tmp.ts';
import { type Decision, PLANNER_DEFAULTS } from './model.ts';
import { replayEvents } from './replay.ts';
import { hitRateBound, parseTraceLine, readTrace, traceEvents } from './trace.ts';

const dir = tempDir('pdctl-trace-');
const line = (o: Record<string, unknown>) => JSON.stringify(o);
const ok = { timestamp: 0, input_length: 1024, output_length: 8, hash_ids: [0, 1] };

describe('trace', () => {
  it('reads requests in order, up to a limit, skipping blank lines', async () => {
    const path = join(dir, 'ok.jsonl');
    writeFileSync(
      path,
      [
        line(ok),
        '',
        line({ ...ok, timestamp: 5, hash_ids: [0, 2, 3] }),
        line({ ...ok, timestamp: 9 }),
      ].join('\n'),
    );
    const all = await readTrace(path);
    expect(all.map((r) => r.timestamp)).toEqual([0, 5, 9]);
    expect(all[1]).toEqual({
      timestamp: 5,
      inputLength: 1024,
      outputLength: 8,
      hashIds: [0, 2, 3],
    });
    expect(await readTrace(path, 2)).toHaveLength(2);
  });

  it.each([
    ['{"timestamp": 0,', /t\.jsonl:7: not JSON/],
    ['[1, 2]', /t\.jsonl:7: not a JSON object/],
    [
      line({ ...ok, input_length: -1 }),
      /t\.jsonl:7: input_length must be a non-negative integer, got -1/,
    ],
    [line({ ...ok, output_length: '8' }), /output_length must be a non-negative integer, got "8"/],
    [line({ ...ok, hash_ids: [0, 'a'] }), /hash_ids must be a list of non-negative integers/],
    [line({ timestamp: 0, input_length: 1, output_length: 1 }), /hash_ids must be a list/],
  ])('names the line and what is wrong: %s', (text, message) => {
    expect(() => parseTraceLine(text, 7, 't.jsonl')).toThrow(message);
  });

  it('refuses arrivals that go back in time, naming the line', async () => {
    const path = join(dir, 'back.jsonl');
    writeFileSync(path, [line({ ...ok, timestamp: 10 }), line({ ...ok, timestamp: 3 })].join('\n'));
    await expect(readTrace(path)).rejects.toThrow(
      /back\.jsonl:2: timestamp 3 is before the previous request's 10/,
    );
  });

  it('bounds reuse by the blocks whose prefix came earlier', () => {
    const at = (hashIds: number[]) => ({ timestamp: 0, inputLength: 0, outputLength: 0, hashIds });
    // 8 blocks; 0 three times (2 repeats), 1 once more (1 repeat): 3 of 8 seen before.
    const r = hitRateBound([at([0, 1, 2]), at([0, 1, 3]), at([0, 4])]);
    expect(r).toEqual({ blocks: 8, seenBefore: 3, bound: 3 / 8 });
    expect(hitRateBound([]).bound).toBe(0);
  });

  it('makes the events a fleet would journal serving it: reused blocks cost no prefill, in time order', () => {
    const req = (
      timestamp: number,
      inputLength: number,
      outputLength: number,
      hashIds: number[],
    ) => ({
      timestamp,
      inputLength,
      outputLength,
      hashIds,
    });
    const evs = traceEvents(
      [req(0, 1024, 10, [0, 1]), req(5, 1500, 2, [0, 1, 2])],
      { prefillUsPerToken: 100, decodeUsPerToken: 1000 },
      1_000_000,
    );
    expect(evs.map((e) => [e.seq, e.type, e.room, e.ts])).toEqual([
      [1, 'room.created', 'trace-0', 1_000_000],
      [2, 'room.created', 'trace-1', 1_000_005],
      // 1500 tokens, two of its three blocks seen before: 1500 - 1024 = 476 computed, 47.6 ms.
      [3, 'room.transfer_posted', 'trace-1', 1_000_053],
      [4, 'room.completed', 'trace-1', 1_000_055],
      [5, 'room.transfer_posted', 'trace-0', 1_000_102],
      [6, 'room.completed', 'trace-0', 1_000_112],
    ]);
    const posted = evs.filter((e) => e.type === 'room.transfer_posted').map((e) => e.data);
    expect(posted).toContainEqual({ computeMicros: 47_600, reusedBlocks: 2 });
    expect(posted).toContainEqual({ computeMicros: 102_400, reusedBlocks: 0 });
  });

  it('replays a trace through the planner with a fleet that follows its proposals', () => {
    // 10 minutes of long prompts (4 s of prefill each, one a second: 4 engines busy), then 10 of
    // long answers (2 s of decode each).
    const reqs = Array.from({ length: 1200 }, (_, i) => ({
      timestamp: i * 1000,
      inputLength: i < 600 ? 40_000 : 100,
      outputLength: i < 600 ? 10 : 2000,
      hashIds: [100_000 + i],
    }));
    const ds: Decision[] = [];
    replayEvents(traceEvents(reqs, { prefillUsPerToken: 100, decodeUsPerToken: 1000 }, 0), {
      intervalMs: 60_000,
      budget: 6,
      config: PLANNER_DEFAULTS,
      follow: { prefill: 3, decode: 3 },
      onDecision: (d) => ds.push(d),
    });
    const fleets = ds.map((d) => `${d.fleet.prefill}/${d.fleet.decode}`);
    // Prefill-heavy: decode engines become prefill, a step every other interval (the hold).
    expect(fleets.slice(0, 5)).toEqual(['3/3', '3/3', '4/2', '4/2', '5/1']);
    expect(ds.map((d) => d.acted).slice(0, 4)).toEqual([false, true, false, true]);
    // Decode-heavy: back the other way, one step at a time.
    expect(fleets.slice(10)).toContain('3/3');
    expect(ds.at(-1)?.proposal.decode).toBe(3);
    expect(ds.every((d) => d.fleet.prefill + d.fleet.decode <= 6)).toBe(true);
  });
});
