import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { tempDir } from '../test/helpers/tmp.ts';
import { summarizeHops } from './hops.ts';

describe('hop marks (PDCTL_HOPS)', () => {
  it('are written by every process that has the variable, and none without it', () => {
    const file = join(tempDir('pdctl-hops-'), 'hops.log');
    const mark = (step: string, type: string | null, room: string, at?: number) =>
      `hop(${JSON.stringify(step)}, ${JSON.stringify(type)}, ${JSON.stringify(room)}${at === undefined ? '' : `, ${at}`})`;
    const run = (env: NodeJS.ProcessEnv, code: string) =>
      execFileSync(
        process.execPath,
        [
          '--import',
          'tsx',
          '--input-type=module',
          '-e',
          `import { hop } from './src/hops.ts'; ${code}`,
        ],
        { env: { ...process.env, ...env }, cwd: join(import.meta.dirname, '..') },
      );
    run({ PDCTL_HOPS: '' }, mark('submit', null, 'r-0'));
    run(
      { PDCTL_HOPS: file },
      `${mark('submit', null, 'r-1', 1000)}; ${mark('committed', 'room.created', 'r-1', 1003.5)}`,
    );
    run(
      { PDCTL_HOPS: file },
      `${mark('compute', null, 'r-1', 1005)}; ${mark('engine-appends', 'room.transfer_completed', 'r-1', 1050.25)}`,
    );
    const text = readFileSync(file, 'utf8');
    expect(text.split('\n').filter(Boolean)).toHaveLength(4);
    expect(text).not.toContain('r-0');
    const s = summarizeHops(text);
    expect(s).toMatchObject({ rooms: 1, marks: 4, processes: 2 });
    expect(s.rows.map((r) => [r.process, r.step, r.p50])).toEqual([
      ['control plane', 'committed room.created', 3.5],
      ['prefill', 'compute', 5],
      ['prefill', 'engine-appends room.transfer_completed', 50.25],
    ]);
  });

  it('summarizes rooms in ms from their own submit, first mark per room and process, p50 and p90', () => {
    const lines: string[] = [];
    for (let i = 0; i < 10; i++) {
      const t0 = 10_000 * i;
      lines.push(`submit - r-${i} ${t0} 1`);
      // The second relay of the same step in the same room is not its first: left out.
      lines.push(`tokens - r-${i} ${t0 + 10 + i} 1`, `tokens - r-${i} ${t0 + 500} 1`);
      lines.push(`engine-has room.created r-${i} ${t0 + 2} 3`);
    }
    lines.push('tokens - r-unknown 5 1', 'not a mark');
    const s = summarizeHops(lines.join('\n'));
    expect(s.rooms).toBe(10);
    expect(s.rows).toEqual([
      { process: 'decode', step: 'engine-has room.created', p50: 2, p90: 2, rooms: 10 },
      { process: 'control plane', step: 'tokens', p50: 15, p90: 19, rooms: 10 },
    ]);
  });
});
