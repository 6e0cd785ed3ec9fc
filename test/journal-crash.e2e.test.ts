/**
 * Crash consistency: SIGKILL a loaded journal writer at random moments; after every kill the
 * journal opens, verifies, and holds every acknowledged event. PDCTL_CRASH_SEED replays a run;
 * for long soaks use `npm run soak:journal -- --rounds N`.
 */
import { describe, expect, it } from 'vitest';
import { crashRounds } from './helpers/crash.ts';
import { tempDir } from './helpers/tmp.ts';

// 10 rounds in CI (about half a minute: the run's 25-minute budget is spent elsewhere), each at a
// random moment of a seed that changes every run; `npm run soak:journal` runs as many as asked.
const ROUNDS = 10;
const SEED = Number(process.env.PDCTL_CRASH_SEED ?? Date.now() % 1_000_000);

describe(`journal crash consistency (${ROUNDS} SIGKILL rounds, seed ${SEED})`, () => {
  it('keeps every acknowledged event and a consistent projection after every kill -9', async () => {
    const dir = tempDir('pdctl-crash-');
    const result = await crashRounds({ path: `${dir}/journal.db`, rounds: ROUNDS, seed: SEED });
    for (const r of result.rounds) {
      expect(
        r.verify,
        `round ${r.round} (seed ${SEED}): ${JSON.stringify(r.verify).slice(0, 500)}`,
      ).toMatchObject({ ok: true });
      expect(
        r.lost,
        `round ${r.round} (seed ${SEED}): acknowledged events missing after SIGKILL`,
      ).toEqual([]);
    }
    expect(result.rounds).toHaveLength(ROUNDS);
    expect(result.acked).toBeGreaterThan(0);
  }, 600_000);
});
