/**
 * `pdctl plan --journal FILE`: what the planner would have decided over a past record, interval by
 * interval (src/planner/replay.ts), without starting or stopping anything; `--trace FILE` plans for a
 * request trace, `--url` reads a serving planner (served.ts).
 */
import { type Command, Option } from 'commander';
import { UsageError } from '../../errors.ts';
import { eventPages } from '../../journal/store.ts';
import { type Decision, moves, PLANNER_DEFAULTS } from '../../planner/model.ts';
import {
  PLANNER_EVENTS,
  type ReplayOptions,
  replayEvents,
  replayPlanner,
} from '../../planner/replay.ts';
import {
  readTrace,
  type TraceCosts,
  TraceError,
  type TraceRequest,
  traceEvents,
} from '../../planner/trace.ts';
import { parseDuration, parseTime } from '../../time.ts';
import { reaching, readTarget } from '../api-client.ts';
import { intArg } from '../args.ts';
import { type CommonOptions, EXIT, note, openReader, print, printJson } from '../context.ts';
import { renderTable } from '../table.ts';
import { servedPlan } from './served.ts';
import { collapseIdle, columns } from './table.ts';

interface PlanOptions extends CommonOptions {
  url?: string;
  trace?: string;
  prefillUsPerToken?: number;
  decodeUsPerToken?: number;
  interval: string;
  budget?: number;
  sloTtftMs: number;
  sloItlMs: number;
  utilisation: string;
  hold: number;
  since?: string;
  until?: string;
}

export function registerPlanCommand(
  program: Command,
  journalOption: (c: Command) => Command,
): void {
  journalOption(
    program
      .command('plan')
      .description(
        'replay a journal through the planner: per interval, the load and latencies it read, the split of prefill and decode engines it would head for, the one step it would propose and why (docs/planner.md lists the reasons)',
      ),
  )
    .option('--interval <duration>', 'how often the planner decides', '60s')
    .option(
      '--budget <n>',
      'engines of both roles the planner may use (default: the largest fleet the journal shows; with --trace: 4, starting half and half)',
      intArg('--budget', 2),
    )
    .option(
      '--slo-ttft-ms <ms>',
      'time-to-first-token target (p90)',
      intArg('--slo-ttft-ms', 1),
      PLANNER_DEFAULTS.sloTtftMs,
    )
    .option(
      '--slo-itl-ms <ms>',
      'inter-token latency target (p90)',
      intArg('--slo-itl-ms', 1),
      PLANNER_DEFAULTS.sloItlMs,
    )
    .addOption(
      new Option('--utilisation <share>', 'share of its time an engine is planned busy').default(
        String(PLANNER_DEFAULTS.utilisation),
      ),
    )
    .option(
      '--hold <n>',
      'intervals in a row a step must be wanted before it is proposed (a step down: twice as many)',
      intArg('--hold', 1),
      PLANNER_DEFAULTS.hold,
    )
    .option(
      '--trace <file>',
      'plan for a request trace (the Mooncake format, ../shared/traces/README.md) instead of a journal: the load its requests make at the costs below, with a fleet that follows the proposals',
    )
    .option(
      '--prefill-us-per-token <n>',
      'with --trace: microseconds of prefill compute a prompt token costs (blocks seen earlier in the trace cost nothing: a perfect prefix cache)',
      intArg('--prefill-us-per-token'),
    )
    .option(
      '--decode-us-per-token <n>',
      'with --trace: microseconds of decode compute an output token costs a room',
      intArg('--decode-us-per-token'),
    )
    .option(
      '--url <url>',
      "a running pdctl serve's planner instead: its mode, targets, proposal and the decisions its journal holds (env PDCTL_URL)",
    )
    .option('--since <time>', 'decisions from this time on')
    .option('--until <time>', 'decisions up to this time')
    .addHelpText(
      'after',
      '\nExamples:\n' +
        '  pdctl plan --url http://127.0.0.1:8080     # what a serving planner proposes now, and its recent decisions\n' +
        '  pdctl plan --journal data/journal.db --since 2h\n' +
        '  pdctl plan --journal copy.db --budget 8 --slo-ttft-ms 300 --interval 5m --json',
    )
    .action(async (opts: PlanOptions, cmd: Command) => {
      if (opts.trace !== undefined && opts.url !== undefined)
        throw new UsageError('--trace plans for a file, --url reads a server: pass one of them');
      const target = opts.trace !== undefined ? { journal: opts.journal } : readTarget(opts, cmd);
      process.exitCode =
        'url' in target
          ? await reaching('plan', () => servedPlan(target.url, opts.json === true))
          : await planCommand(opts);
    });
}

export async function planCommand(opts: PlanOptions): Promise<number> {
  const intervalMs = parseDuration(opts.interval, '--interval');
  if (intervalMs < 1000) throw new UsageError('--interval must be at least 1s');
  const utilisation = Number(opts.utilisation);
  if (!(utilisation > 0 && utilisation <= 1))
    throw new UsageError(
      `--utilisation must be a share above 0 and at most 1, got "${opts.utilisation}"`,
    );
  const now = Date.now();
  const decisions: Decision[] = [];
  const onTrace = opts.trace !== undefined;
  const replay: ReplayOptions = {
    intervalMs,
    budget: opts.budget ?? (onTrace ? TRACE_BUDGET : null),
    config: { sloTtftMs: opts.sloTtftMs, sloItlMs: opts.sloItlMs, utilisation, hold: opts.hold },
    // A trace's times are from its start: --since and --until are offsets into it.
    ...(opts.since
      ? { since: onTrace ? offsetOf(opts.since, '--since') : parseTime(opts.since, now) }
      : {}),
    ...(opts.until
      ? { until: onTrace ? offsetOf(opts.until, '--until') : parseTime(opts.until, now) }
      : {}),
    onDecision: (d) => decisions.push(d),
  };
  if (opts.trace !== undefined) {
    const costs = traceCosts(opts);
    const budget = replay.budget ?? TRACE_BUDGET;
    const follow = { prefill: Math.ceil(budget / 2), decode: Math.floor(budget / 2) };
    let requests: TraceRequest[];
    try {
      requests = await readTrace(opts.trace);
    } catch (err) {
      if (err instanceof TraceError) throw new UsageError(err.message);
      throw new UsageError(`cannot read the trace ${opts.trace}: ${(err as Error).message}`);
    }
    note(
      `${requests.length} requests from ${opts.trace}; a fleet of ${follow.prefill} prefill and ${follow.decode} decode engines, moved as the planner proposes`,
    );
    replayEvents(traceEvents(requests, costs, 0), { ...replay, follow });
  } else {
    const reader = openReader(opts);
    try {
      await replayPlanner(eventPages(reader, { type: [...PLANNER_EVENTS] }), replay);
    } finally {
      await reader.close();
    }
  }
  if (opts.json) {
    printJson(decisions);
    return EXIT.ok;
  }
  if (decisions.length === 0) {
    note(
      `no intervals to decide: the ${onTrace ? 'trace' : 'journal'} holds no room or engine events in that time`,
    );
    return EXIT.ok;
  }
  print(renderTable(collapseIdle(decisions), columns(onTrace)));
  const steps = decisions.filter(moves);
  print(
    `${decisions.length} intervals of ${opts.interval}; ${steps.length} step${steps.length === 1 ? '' : 's'} ${onTrace ? 'taken' : 'proposed'}; targets: TTFT p90 ≤ ${opts.sloTtftMs} ms, ITL p90 ≤ ${opts.sloItlMs} ms, utilisation ${utilisation}`,
  );
  return EXIT.ok;
}

/** Engines a trace is planned for without --budget. */
const TRACE_BUDGET = 4;

/** A time given for a trace: an offset from its start (`10m`), in ms. */
function offsetOf(v: string, flag: string): number {
  return parseDuration(v, `${flag} (with --trace: an offset from the trace's start, e.g. 10m)`);
}

function traceCosts(opts: PlanOptions): TraceCosts {
  if (opts.prefillUsPerToken === undefined || opts.decodeUsPerToken === undefined)
    throw new UsageError(
      '--trace needs what a token costs your engines: --prefill-us-per-token N --decode-us-per-token N (microseconds of compute a token, per room)',
    );
  return { prefillUsPerToken: opts.prefillUsPerToken, decodeUsPerToken: opts.decodeUsPerToken };
}
