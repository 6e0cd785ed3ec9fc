/** The trace reader of bench:trace (bench/trace.ts): the Mooncake format, bad lines, the reuse bound. */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { hitRateBound, parseTraceLine, readTrace } from '../bench/trace.ts';
import { tempDir } from './helpers/tmp.ts';

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
});
