/** The planner's flags on `pdctl serve`, and the planner options they make. */
import { type Command, Option } from 'commander';
import { UsageError } from '../../errors.ts';
import { PLANNER_DEFAULTS } from '../../planner/model.ts';
import { PLANNER_MODES, type PlannerMode, type PlannerOptions } from '../../planner/online.ts';
import { parseDuration } from '../../time.ts';
import { intArg } from '../args.ts';

/** The flags (docs/planner.md). */
export function plannerServeOptions(c: Command): Command {
  return c
    .addOption(
      new Option(
        '--planner <mode>',
        'the planner: advise journals each interval the split of prefill and decode engines it would run and why (planner.decision, pdctl plan --url, /v1/planner, pdctl_planner_desired_engines), acting on nothing; act: and carries out each step on the engines serve runs (starts one, or retires one after it finished its rooms); off: none',
      )
        .choices([...PLANNER_MODES])
        .env('PDCTL_PLANNER')
        .default('advise'),
    )
    .option('--planner-interval <duration>', 'how often the planner decides', '60s')
    .option(
      '--planner-budget <n>',
      'engines of both roles the planner may propose (default: the engines serve spawns)',
      intArg('--planner-budget', 2),
    )
    .option(
      '--slo-ttft-ms <ms>',
      "the planner's time-to-first-token target (p90)",
      intArg('--slo-ttft-ms', 1),
      PLANNER_DEFAULTS.sloTtftMs,
    )
    .option(
      '--slo-itl-ms <ms>',
      "the planner's inter-token latency target (p90)",
      intArg('--slo-itl-ms', 1),
      PLANNER_DEFAULTS.sloItlMs,
    );
}

/** The planner of `pdctl serve`'s flags. */
export function plannerOf(o: Record<string, unknown>): PlannerOptions {
  const intervalMs = parseDuration(o.plannerInterval as string, '--planner-interval');
  if (intervalMs < 1000) throw new UsageError('--planner-interval must be at least 1s');
  return {
    mode: o.planner as PlannerMode,
    intervalMs,
    sloTtftMs: o.sloTtftMs as number,
    sloItlMs: o.sloItlMs as number,
    ...(o.plannerBudget !== undefined ? { budget: o.plannerBudget as number } : {}),
  };
}
