/**
 * The planner's decision for one interval: from the window's record (record.ts) and the fleet it
 * ran on, the engines each role needs, the split of the budget it would go to, and one bounded
 * step toward it — held back until the same step was wanted for `hold` intervals in a row on the
 * same fleet (twice that for a step down; one interval for a role missing its latency target and
 * short of two engines or more), so that a noisy interval does not flap the fleet. Pure: the same
 * record gives the same decision, in the control plane and in `pdctl plan --journal`.
 *
 * The model (docs/planner.md): a role needs its load (engine-seconds of work a second) over the
 * utilisation it is run at; a latency target it missed while its engines were busy asks one more
 * engine of that role than the load alone does (time to first token: prefill; inter-token
 * latency: decode). Where both roles need more than the budget holds, the budget is split in
 * proportion to what each needs, at least one engine each.
 */
import type { Fleet, Role, WindowSummary } from './record.ts';

export interface PlannerConfig {
  /** Engines of both roles together the planner may use. */
  budget: number;
  sloTtftMs: number;
  sloItlMs: number;
  /** Share of an engine's time a role is planned to be busy (0.7: 30 % for bursts). */
  utilisation: number;
  /** Intervals in a row the same step must be wanted before it is proposed (a step down: twice). */
  hold: number;
}

export const PLANNER_DEFAULTS: Omit<PlannerConfig, 'budget'> = {
  sloTtftMs: 500,
  sloItlMs: 50,
  utilisation: 0.7,
  hold: 2,
};

/**
 * Why the planner proposed what it did; docs/planner.md lists them with what each means.
 * A step: `prefill_short`, `decode_short` (one engine more), `rebalance_to_prefill`,
 * `rebalance_to_decode` (one engine changes role: the budget is spent), `prefill_idle`,
 * `decode_idle` (one engine fewer). A hold: `steady`, `waiting` (a step wanted, not yet for long
 * enough), `at_budget` (short, and the budget spent on a role that needs what it has),
 * `no_traffic` (nothing arrived or completed: no evidence to act on).
 */
export const REASONS = [
  'prefill_short',
  'decode_short',
  'rebalance_to_prefill',
  'rebalance_to_decode',
  'prefill_idle',
  'decode_idle',
  'steady',
  'waiting',
  'at_budget',
  'no_traffic',
] as const;
export type Reason = (typeof REASONS)[number];

/** The reasons that move the fleet: one engine more, fewer, or of the other role. */
export type Step = Exclude<Reason, 'steady' | 'waiting' | 'at_budget' | 'no_traffic'>;

export interface Decision {
  window: { from: number; to: number };
  inputs: WindowSummary;
  /** The fleet the window ran on. */
  fleet: Fleet;
  /** Engines each role needs, unrounded, from its load and its latency target. */
  need: { prefill: number; decode: number };
  /** What the latency targets added: the role missed its target while busy. */
  sloMissed: { ttft: boolean; itl: boolean };
  /** The split of the budget the planner heads for. */
  target: Fleet;
  /** One step from `fleet` toward `target` (or `fleet` itself on a hold). */
  proposal: Fleet;
  reason: Reason;
  /** For `waiting`: the step wanted, and for how many intervals in a row. */
  wanted: { step: Step; intervals: number } | null;
  acted: boolean;
}

/**
 * What the planner remembers between intervals: the step it wanted last and for how many
 * intervals in a row, and the fleet it saw. A step stays proposed every interval while it is
 * wanted (advise: until someone acts on it); when the fleet changes, the count starts again, so
 * that a step is judged on intervals the new fleet ran.
 */
export interface PlannerMemory {
  step: Step | null;
  streak: number;
  fleet: Fleet | null;
}

/** Whether the decision proposes a fleet other than the one it ran on (a step, not a hold). */
export const moves = (d: Decision): boolean =>
  d.proposal.prefill !== d.fleet.prefill || d.proposal.decode !== d.fleet.decode;

export const freshMemory = (): PlannerMemory => ({ step: null, streak: 0, fleet: null });

/** A role's latency target counts only when its engines were at least this busy (else it is not theirs to fix). */
const BUSY_FOR_SLO = 0.5;

/** The decision for `summary`, which ran on `fleet`; `memory` is updated for the next interval. */
export function decide(
  summary: WindowSummary,
  fleet: Fleet,
  config: PlannerConfig,
  memory: PlannerMemory,
): Decision {
  const sloMissed = {
    ttft:
      (summary.ttftMs.p90 ?? 0) > config.sloTtftMs &&
      summary.load.prefill >= BUSY_FOR_SLO * Math.max(fleet.prefill, 1),
    itl:
      (summary.itlMs.p90 ?? 0) > config.sloItlMs &&
      summary.load.decode >= BUSY_FOR_SLO * Math.max(fleet.decode, 1),
  };
  const need = {
    prefill: Math.max(
      summary.load.prefill / config.utilisation,
      sloMissed.ttft ? fleet.prefill + 1 : 0,
    ),
    decode: Math.max(
      summary.load.decode / config.utilisation,
      sloMissed.itl ? fleet.decode + 1 : 0,
    ),
  };
  const target = split(need, config.budget);
  const base = { window: { from: summary.from, to: summary.to }, inputs: summary, fleet, need };
  const hold = (reason: Reason, wanted: Decision['wanted'] = null): Decision => ({
    ...base,
    sloMissed,
    target,
    proposal: { ...fleet },
    reason,
    wanted,
    acted: false,
  });
  const sameFleet =
    memory.fleet?.prefill === fleet.prefill && memory.fleet?.decode === fleet.decode;
  if (!sameFleet) Object.assign(memory, freshMemory(), { fleet: { ...fleet } });
  if (summary.arrivalsPerS === 0 && summary.outputTokens.count === 0) {
    Object.assign(memory, { step: null, streak: 0 });
    return hold('no_traffic');
  }
  const step = stepToward(fleet, target, need, config.budget);
  if (step === 'steady' || step === 'at_budget') {
    Object.assign(memory, { step: null, streak: 0 });
    return hold(step);
  }
  memory.streak = memory.step === step ? memory.streak + 1 : 1;
  memory.step = step;
  const needed = step.endsWith('_idle')
    ? 2 * config.hold
    : urgent(step, fleet, target, need, sloMissed)
      ? 1
      : config.hold;
  if (memory.streak < needed) return hold('waiting', { step, intervals: memory.streak });
  return { ...hold(step), proposal: applyStep(fleet, step) };
}

/**
 * A step that grows a role missing its latency target and short of this many engines or more — by
 * its target, or by its need where the budget caps the target — is taken after one interval, not
 * `hold`: that is not noise (a load that swings between the roles meets its targets, and waits),
 * and every interval it waits is paid in latency.
 */
const FAR = 2;

function urgent(
  step: Step,
  fleet: Fleet,
  target: Fleet,
  need: { prefill: number; decode: number },
  sloMissed: { ttft: boolean; itl: boolean },
): boolean {
  const grows: Role | null =
    step === 'prefill_short' || step === 'rebalance_to_prefill'
      ? 'prefill'
      : step === 'decode_short' || step === 'rebalance_to_decode'
        ? 'decode'
        : null;
  if (grows === null || !(grows === 'prefill' ? sloMissed.ttft : sloMissed.itl)) return false;
  return Math.max(target[grows], Math.ceil(need[grows] - 1e-9)) - fleet[grows] >= FAR;
}

/** Whole engines per role within the budget, at least one each. */
export function split(need: { prefill: number; decode: number }, budget: number): Fleet {
  const p = Math.max(1, Math.ceil(need.prefill - 1e-9));
  const d = Math.max(1, Math.ceil(need.decode - 1e-9));
  if (p + d <= budget) return { prefill: p, decode: d };
  const share = need.prefill / Math.max(need.prefill + need.decode, 1e-9);
  const prefill = Math.min(budget - 1, Math.max(1, Math.round(budget * share)));
  return { prefill, decode: budget - prefill };
}

/** Below this many engines' worth of need under what it has, a role is not idle enough to lose one. */
const IDLE_BAND = 0.25;

function stepToward(
  fleet: Fleet,
  target: Fleet,
  need: { prefill: number; decode: number },
  budget: number,
): Step | 'steady' | 'at_budget' {
  const total = fleet.prefill + fleet.decode;
  // Busy share of each role's engines; a role with none counts as full.
  const busy = (r: Role) => (fleet[r] > 0 ? need[r] / fleet[r] : Number.POSITIVE_INFINITY);
  if (total > budget) {
    // A fleet sized larger than the budget (before the planner): the idler role gives one back.
    const idler: Role = busy('prefill') < busy('decode') ? 'prefill' : 'decode';
    const other: Role = idler === 'prefill' ? 'decode' : 'prefill';
    if (fleet[idler] > 1) return `${idler}_idle`;
    if (fleet[other] > 1) return `${other}_idle`;
    return 'at_budget';
  }
  const short = (r: Role) => target[r] - fleet[r];
  // The role short by more, for what it has, goes first.
  const order: Role[] =
    short('prefill') / Math.max(fleet.prefill, 1) >= short('decode') / Math.max(fleet.decode, 1)
      ? ['prefill', 'decode']
      : ['decode', 'prefill'];
  for (const role of order) {
    if (short(role) <= 0) continue;
    const other: Role = role === 'prefill' ? 'decode' : 'prefill';
    if (total < budget) return `${role}_short`;
    if (short(other) < 0 && fleet[other] > 1) return `rebalance_to_${role}`;
  }
  // Short of what the load needs with the budget spent: say so rather than `steady`.
  const under = (r: Role) => target[r] > fleet[r] || Math.ceil(need[r] - 1e-9) > fleet[r];
  if (under('prefill') || under('decode')) return 'at_budget';
  for (const role of order) {
    if (fleet[role] > 1 && short(role) < 0 && need[role] <= fleet[role] - 1 - IDLE_BAND)
      return `${role}_idle`;
  }
  return 'steady';
}

function applyStep(fleet: Fleet, step: Step): Fleet {
  const next = { ...fleet };
  switch (step) {
    case 'prefill_short':
      next.prefill++;
      break;
    case 'decode_short':
      next.decode++;
      break;
    case 'rebalance_to_prefill':
      next.prefill++;
      next.decode--;
      break;
    case 'rebalance_to_decode':
      next.decode++;
      next.prefill--;
      break;
    case 'prefill_idle':
      next.prefill--;
      break;
    case 'decode_idle':
      next.decode--;
      break;
  }
  return next;
}
