/**
 * `pdctl drill planner-scale-down`: the planner acting under load (`--planner act`, issue 43). A
 * fleet of 2 prefill and 2 decode engines serves streaming clients whose answers are long next to
 * their prompts: the planner moves engines to decode — each step retires an engine (drained,
 * stopped, forgotten) and, for a change of role, starts one of the other role. What must hold: no
 * request fails and no stream breaks while it does, each retirement drains before its engine
 * stops, and the harness's invariants (every room terminal, right answers, no page leaked, verify).
 */
import type { DrillScenario } from './harness.ts';
import { errorsSeen } from './load.ts';
import { until } from './poll.ts';

export const plannerScaleDown: DrillScenario = {
  name: 'planner-scale-down',
  summary:
    'the planner, acting, retires and re-roles engines under streaming load: no request fails, every retirement drained first',
  remote: {
    unsupported:
      'the planner acts on the engines of the stack the drill starts (--planner act on a serve of your own is the same code)',
  },
  stack: {
    prefillEngines: 2,
    decodeEngines: 2,
    planner: { mode: 'act', intervalMs: 1000, hold: 1 },
  },
  async run(ctx) {
    const started = Date.now();
    const load = ctx.load({ maxTokens: 48 });
    const stopped = await until(async () => {
      const states = await ctx.target.events('engine.lifecycle', started);
      return states.some((e) => e.data.state === 'stopped') ? states : undefined;
    }, 30_000);
    // A step that changes a role starts its new engine after the old one stopped: let it join.
    await ctx.sleep(3000);
    const states = (await ctx.target.events('engine.lifecycle', started)) ?? stopped ?? [];
    for (const e of states)
      ctx.mark(
        `${e.engine} ${e.data.state} (${e.data.role}, ${e.data.reason}${e.data.rooms !== undefined ? `, ${e.data.rooms} rooms left` : ''}${e.data.replaces !== undefined ? `, in place of ${e.data.replaces}` : ''})`,
        e.ts,
      );
    const steps = (await ctx.target.events('planner.decision', started)).filter(
      (e) => e.data.acted,
    );
    // A change of role names the engine its new one took the place of: one that stopped.
    const gone = new Set(states.filter((e) => e.data.state === 'stopped').map((e) => e.engine));
    const replaced = states
      .filter((e) => e.data.state === 'started' && e.data.reason.startsWith('rebalance_'))
      .every((e) => e.data.replaces !== undefined && gone.has(e.data.replaces));
    ctx.check({
      name: 'the planner stepped under load',
      ok: steps.length > 0 && gone.size > 0 && replaced,
      figure: {
        steps: steps.map((e) => e.data.reason).join(', ') || 'none',
        retired: states.filter((e) => e.data.state === 'stopped').length,
        started: states.filter((e) => e.data.state === 'started').length,
      },
      detail:
        'planner.decision acted, an engine.lifecycle stopped, and each engine started for a change of role names the one it replaces',
    });
    const drained = states.filter((e) => e.data.state === 'drained');
    ctx.check({
      name: 'each retired engine finished its rooms before it stopped',
      ok: drained.length > 0 && drained.every((e) => e.data.rooms === 0),
      figure: { left: drained.map((e) => e.data.rooms ?? 0).join(', ') || 'none' },
      detail: 'engine.lifecycle drained with no room left at the deadline',
    });
    await load.stop();
    const failed = load.records.filter((r) => r.outcome !== 'completed');
    ctx.check({
      name: 'no request failed, no stream broke',
      ok: load.records.length > 0 && failed.length === 0,
      figure: { requests: load.records.length, failed: failed.length },
      detail: failed.length > 0 ? errorsSeen(failed) : 'every stream ended with its finish reason',
    });
  },
};
