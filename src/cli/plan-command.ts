/**
 * `pdctl plan --journal FILE`: what the planner would have decided over a past record, interval by
 * interval (src/planner/replay.ts), without starting or stopping anything.
 */
import { type Command, Option } from 'commander';
import { UsageError } from '../errors.ts';
import { type Decision, PLANNER_DEFAULTS } from '../planner/model.ts';
import { PLANNER_MODES, type PlannerMode, type PlannerOptions } from '../planner/online.ts';
import type { Distribution } from '../planner/record.ts';
import { type ReplayOptions, replayEvents, replayPlanner } from '../planner/replay.ts';
import {
  readTrace,
  type TraceCosts,
  TraceError,
  type TraceRequest,
  traceEvents,
} from '../planner/trace.ts';
import { formatTs, parseDuration, parseTime } from '../time.ts';
import { intArg } from './args.ts';
import { type CommonOptions, EXIT, note, openReader, print, printJson } from './context.ts';
import { callServer, errorOf, reaching, readTarget } from './server.ts';
import { renderTable } from './table.ts';

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
      await replayPlanner(reader, replay);
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
  const steps = decisions.filter(changed);
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

/** The planner of a running serve: `GET /v1/planner`. */
async function servedPlan(url: string, json: boolean): Promise<number> {
  const r = await callServer<PlannerAnswer>(url, '/v1/planner');
  if (r.status === 404)
    throw new UsageError(
      `${url} runs no planner (started with --planner off, or a pdctl before it)`,
    );
  if (r.status !== 200) throw new UsageError(errorOf(r.status, r.body));
  if (json) {
    printJson(r.body);
    return EXIT.ok;
  }
  const { mode, intervalMs, config, last, recent } = r.body;
  print(
    `planner: ${mode}, every ${intervalMs / 1000} s; budget ${config.budget} engines; targets: TTFT p90 ≤ ${config.sloTtftMs} ms, ITL p90 ≤ ${config.sloItlMs} ms, utilisation ${config.utilisation}`,
  );
  print(
    last
      ? `now: ${last.fleet.prefill} prefill / ${last.fleet.decode} decode; proposes ${last.proposal.prefill} / ${last.proposal.decode} (${last.reason}); heads for ${last.target.prefill} / ${last.target.decode}`
      : `no decision yet: the first comes ${intervalMs / 1000} s after the start`,
  );
  if (recent.length === 0) return EXIT.ok;
  const rows = recent
    .map((e) => ({ ...e.data, window: { from: e.data.inputs.from, to: e.data.inputs.to } }))
    .reverse();
  print(renderTable(collapseIdle(rows), columns(false)));
  return EXIT.ok;
}

interface PlannerAnswer {
  mode: string;
  intervalMs: number;
  config: { budget: number; sloTtftMs: number; sloItlMs: number; utilisation: number };
  last: Decision | null;
  /** Newest first. */
  recent: Array<{ seq: number; ts: number; data: Omit<Decision, 'window'> }>;
}

const changed = (d: Decision) =>
  d.proposal.prefill !== d.fleet.prefill || d.proposal.decode !== d.fleet.decode;

/** A row per decision, except that a run of intervals with no traffic is one row. */
type Row = Decision & { idle?: number };

function collapseIdle(decisions: Decision[]): Row[] {
  const rows: Row[] = [];
  for (const d of decisions) {
    const last = rows[rows.length - 1];
    if (d.reason === 'no_traffic' && last?.reason === 'no_traffic') {
      last.idle = (last.idle ?? 1) + 1;
      last.window = { from: last.window.from, to: d.window.to };
    } else rows.push({ ...d });
  }
  return rows;
}

const num = (v: number, digits = 1) => v.toFixed(digits);
const dist = (d: Distribution) => (d.count === 0 ? null : `${d.p50}/${d.p90}`);
const ms = (d: Distribution) =>
  d.count === 0 ? null : `${Math.round(d.p50 ?? 0)}/${Math.round(d.p90 ?? 0)}`;

/** ms from a trace's start as `+h:mm:ss`. */
function clockOf(ms: number): string {
  const s = Math.floor(ms / 1000);
  const two = (n: number) => String(n).padStart(2, '0');
  return `+${Math.floor(s / 3600)}:${two(Math.floor(s / 60) % 60)}:${two(s % 60)}`;
}

/** `offset`: the first column is the time from the trace's start, not a UTC time. */
const columns = (offset: boolean) => [
  offset
    ? {
        header: 'from start',
        value: (d: Row) => clockOf(d.window.from),
        align: 'left' as const,
      }
    : { header: 'from (UTC)', value: (d: Row) => formatTs(d.window.from), align: 'left' as const },
  { header: 'rooms/s', value: (d: Row) => num(d.inputs.arrivalsPerS) },
  { header: 'prompt p50/p90', value: (d: Row) => dist(d.inputs.promptTokens) },
  { header: 'output p50/p90', value: (d: Row) => dist(d.inputs.outputTokens) },
  {
    header: 'load P/D',
    value: (d: Row) => `${num(d.inputs.load.prefill, 2)}/${num(d.inputs.load.decode, 2)}`,
  },
  { header: 'TTFT ms p50/p90', value: (d: Row) => ms(d.inputs.ttftMs) },
  { header: 'ITL ms p50/p90', value: (d: Row) => ms(d.inputs.itlMs) },
  { header: 'fleet P/D', value: (d: Row) => `${d.fleet.prefill}/${d.fleet.decode}` },
  { header: 'target P/D', value: (d: Row) => `${d.target.prefill}/${d.target.decode}` },
  { header: 'proposal P/D', value: (d: Row) => `${d.proposal.prefill}/${d.proposal.decode}` },
  {
    header: 'reason',
    value: (d: Row) =>
      d.idle !== undefined
        ? `no_traffic ×${d.idle}`
        : d.wanted
          ? `waiting (${d.wanted.step} ${d.wanted.intervals})`
          : d.reason,
    align: 'left' as const,
  },
];

/** The planner's flags on `pdctl serve` (docs/planner.md). */
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
