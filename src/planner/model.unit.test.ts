import { describe, expect, it } from 'vitest';
import { type Decision, decide, freshMemory, type PlannerConfig, split } from './model.ts';
import { distribution, type Fleet, type WindowSummary } from './record.ts';

const config: PlannerConfig = {
  budget: 4,
  sloTtftMs: 500,
  sloItlMs: 50,
  utilisation: 0.7,
  hold: 2,
};

/** A minute of record: `load` engine-seconds a second per role, latencies as given. */
function minute(load: Fleet, ttft = 100, itl = 10, i = 0): WindowSummary {
  return {
    from: i * 60_000,
    to: (i + 1) * 60_000,
    arrivalsPerS: 10,
    promptTokens: distribution([500]),
    outputTokens: distribution([100]),
    prefixReuse: null,
    ttftMs: distribution([ttft]),
    itlMs: distribution([itl]),
    load,
    queued: 0,
    refused: 0,
    failed: 0,
    engines: { prefill: 2, decode: 2 },
  };
}

/** The decisions of `n` like minutes on a fleet that acts on every proposal (as `act` would). */
function run(n: number, load: Fleet, start: Fleet, cfg = config, ttft = 100, itl = 10) {
  const memory = freshMemory();
  let fleet = start;
  const out: Decision[] = [];
  for (let i = 0; i < n; i++) {
    const d = decide(minute(load, ttft, itl, i), fleet, cfg, memory);
    out.push(d);
    fleet = d.proposal;
  }
  return out;
}

describe('planner model', () => {
  it('splits the budget in proportion to need, at least one engine a role', () => {
    expect(split({ prefill: 1.2, decode: 0.5 }, 4)).toEqual({ prefill: 2, decode: 1 });
    expect(split({ prefill: 9, decode: 3 }, 4)).toEqual({ prefill: 3, decode: 1 });
    expect(split({ prefill: 9, decode: 0 }, 4)).toEqual({ prefill: 3, decode: 1 });
    expect(split({ prefill: 2, decode: 6 }, 4)).toEqual({ prefill: 1, decode: 3 });
  });

  it('moves a decode engine to prefill under a prefill-heavy load, after `hold` intervals, one step at a time', () => {
    const ds = run(6, { prefill: 2.6, decode: 0.3 }, { prefill: 2, decode: 2 });
    expect(ds.map((d) => d.reason)).toEqual([
      'waiting',
      'rebalance_to_prefill',
      // 3.7 prefill engines' worth of need: the budget of 4 holds 3 and the one decode engine.
      'at_budget',
      'at_budget',
      'at_budget',
      'at_budget',
    ]);
    expect(ds[1]?.proposal).toEqual({ prefill: 3, decode: 1 });
    expect(ds[0]?.wanted).toEqual({ step: 'rebalance_to_prefill', intervals: 1 });
  });

  it('keeps proposing a wanted step while nobody acts on it (advise), and holds when the load is met', () => {
    const memory = freshMemory();
    const fleet = { prefill: 2, decode: 2 };
    const reasons = [0, 1, 2, 3].map(
      (i) =>
        decide(minute({ prefill: 0.3, decode: 2.6 }, 100, 10, i), fleet, config, memory).reason,
    );
    expect(reasons).toEqual([
      'waiting',
      'rebalance_to_decode',
      'rebalance_to_decode',
      'rebalance_to_decode',
    ]);
    expect(decide(minute({ prefill: 1, decode: 1 }), fleet, config, memory).reason).toBe('steady');
  });

  it('does not flap: a load that alternates between the roles every interval never reaches `hold`', () => {
    const memory = freshMemory();
    const fleet = { prefill: 2, decode: 2 };
    for (let i = 0; i < 10; i++) {
      const load = i % 2 ? { prefill: 2.6, decode: 0.3 } : { prefill: 0.3, decode: 2.6 };
      const d = decide(minute(load, 100, 10, i), fleet, config, memory);
      expect(d.reason).toBe('waiting');
      expect(d.proposal).toEqual(fleet);
    }
  });

  it('grows a role under budget, and sheds an idle engine only after twice the hold', () => {
    const up = run(
      4,
      { prefill: 0.5, decode: 2.5 },
      { prefill: 1, decode: 1 },
      { ...config, budget: 6 },
    );
    expect(up.map((d) => d.reason)).toEqual(['waiting', 'decode_short', 'waiting', 'decode_short']);
    expect(up[3]?.proposal).toEqual({ prefill: 1, decode: 3 });
    const down = run(
      6,
      { prefill: 0.2, decode: 0.2 },
      { prefill: 1, decode: 3 },
      { ...config, budget: 6 },
    );
    expect(down.map((d) => d.reason).slice(0, 4)).toEqual([
      'waiting',
      'waiting',
      'waiting',
      'decode_idle',
    ]);
    expect(down[3]?.proposal).toEqual({ prefill: 1, decode: 2 });
  });

  it('takes a step at once for a role two engines short that misses its latency target, then waits the hold', () => {
    // 1/1 with 2.5 decode engines busy and ITL 80 ms over its 50: 3.6 wanted, short of 2 or more
    // until 1/3, where the budget of 4 caps it.
    const ds = run(4, { prefill: 0.3, decode: 2.5 }, { prefill: 1, decode: 1 }, config, 100, 80);
    expect(ds.map((d) => d.reason)).toEqual([
      'decode_short',
      'decode_short',
      'at_budget',
      'at_budget',
    ]);
    // The same shortfall meeting its target waits the hold.
    const met = run(2, { prefill: 0.3, decode: 2.5 }, { prefill: 1, decode: 1 }, config);
    expect(met.map((d) => d.reason)).toEqual(['waiting', 'decode_short']);
  });

  it('asks one more engine of the role whose latency target was missed while it was busy, not of an idle one', () => {
    const ttft = decide(
      minute({ prefill: 1.2, decode: 0.6 }, 900),
      { prefill: 2, decode: 2 },
      { ...config, hold: 1, budget: 6 },
      freshMemory(),
    );
    expect(ttft.sloMissed).toEqual({ ttft: true, itl: false });
    expect(ttft.reason).toBe('prefill_short');
    const idle = decide(
      minute({ prefill: 0.2, decode: 0.6 }, 900),
      { prefill: 2, decode: 2 },
      { ...config, hold: 1, budget: 6 },
      freshMemory(),
    );
    expect(idle.sloMissed.ttft).toBe(false);
    const itl = decide(
      minute({ prefill: 0.2, decode: 1.2 }, 100, 80),
      { prefill: 2, decode: 2 },
      { ...config, hold: 1, budget: 6 },
      freshMemory(),
    );
    expect(itl.reason).toBe('decode_short');
  });

  it('holds at the budget when every role is short, and on no traffic', () => {
    const full = decide(
      minute({ prefill: 3, decode: 3 }),
      { prefill: 2, decode: 2 },
      config,
      freshMemory(),
    );
    expect(full.reason).toBe('at_budget');
    const none = decide(
      { ...minute({ prefill: 0, decode: 0 }), arrivalsPerS: 0, outputTokens: distribution([]) },
      { prefill: 2, decode: 2 },
      config,
      freshMemory(),
    );
    expect(none.reason).toBe('no_traffic');
    expect(none.proposal).toEqual({ prefill: 2, decode: 2 });
  });

  it('brings a fleet larger than the budget back within it, from the idler role', () => {
    const d = decide(
      minute({ prefill: 0.4, decode: 2 }),
      { prefill: 3, decode: 3 },
      { ...config, hold: 1 },
      freshMemory(),
    );
    // A step down waits twice the hold.
    expect(d.reason).toBe('waiting');
    expect(d.wanted?.step).toBe('prefill_idle');
  });
});
