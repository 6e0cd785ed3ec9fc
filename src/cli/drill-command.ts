/** `pdctl drill <scenario>`: replay a failure against a live stack and check every invariant. */
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import type { Command } from 'commander';
import { Argument, Option } from 'commander';
import { type DrillScenario, remoteBlocker, runDrill, runRemoteDrill } from '../drills/harness.ts';
import { renderHtml } from '../drills/html.ts';
import { DRILLS } from '../drills/index.ts';
import { RemoteTarget, TargetError } from '../drills/remote-target.ts';
import {
  type DrillReport,
  holdTargets,
  renderReport,
  renderSummary,
  TIMING_TARGETS,
} from '../drills/report.ts';
import { ENGINE_DEFAULTS } from '../engine/options.ts';
import { UsageError } from '../errors.ts';
import { LOG_LEVELS, type LogLevel, processLogger } from '../log.ts';
import { checkModelFile } from '../model/llama/runtime.ts';
import { intArg } from './args.ts';
import { EXIT, note, print, printJson, VERSION } from './context.ts';

interface DrillFlags {
  clients?: number;
  dataDir: string;
  json?: boolean;
  report?: string;
  baseline: boolean;
  journalEvents: number;
  postgres?: string;
  strictTargets?: boolean;
  url?: string;
  model?: string;
  sequences: number;
  logLevel: LogLevel;
  outlierEjection: boolean;
  retryLimit?: number;
  target: Array<[string, number]>;
}

/** The report with its timing targets as `--target` holds them. */
const held = (report: DrillReport, o: DrillFlags) =>
  holdTargets(report, new Map(o.target), o.strictTargets === true);

/** `--target NAME=MS`, each given: a timing target the drills report, and the figure to hold it to. */
function targetArg(v: string, prev: Array<[string, number]>): Array<[string, number]> {
  const at = v.lastIndexOf('=');
  const name = v.slice(0, Math.max(0, at));
  const ms = v.slice(at + 1);
  if (at < 0 || !TIMING_TARGETS.includes(name))
    throw new UsageError(
      `--target ${v}: give NAME=MS, NAME one of the drills' timing targets: ${TIMING_TARGETS.map((t) => `"${t}"`).join(', ')}`,
    );
  if (!/^\d+$/.test(ms)) throw new UsageError(`--target ${v}: MS must be a non-negative integer`);
  return [...prev, [name, Number(ms)]];
}

export function registerDrillCommand(program: Command): void {
  const names = DRILLS.map((d) => d.name);
  program
    .command('drill')
    .description(
      'Run a crash-recovery drill against a stack it starts (journal in --data-dir), or against a running ' +
        '`pdctl serve` (--url): apply load, inject the fault, then check and print every invariant with its ' +
        'figure, and time a full-stack restart for comparison. `all` runs every drill in turn. Exit 0 when ' +
        'every invariant holds.',
    )
    .addArgument(new Argument('<scenario>', 'the failure to replay').choices([...names, 'all']))
    .option(
      '--clients <n>',
      'streaming clients (default: 200 for abort-cascade, 8 for the others)',
      (v) => {
        if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 10_000)
          throw new UsageError(`--clients must be an integer from 1 to 10000, got "${v}"`);
        return Number(v);
      },
    )
    .option('--data-dir <dir>', 'where the drill journals go', './data/drills')
    .option(
      '--url <url>',
      'drill the pdctl serve at this URL instead of starting a stack (see "Against a running stack" below)',
    )
    .option(
      '--model <path.gguf>',
      'serve this llama.cpp model in the stacks the drills start, instead of the built-in one',
    )
    .option(
      '--sequences <n>',
      'with --model: llama.cpp sequences per engine',
      intArg('--sequences', 1),
      ENGINE_DEFAULTS.sequences,
    )
    .option('--json', 'the report as one JSON object (`all`: an array)')
    .option('--report <file>', 'also write a self-contained HTML report with a timeline chart')
    .option('--no-baseline', 'skip timing a full-stack restart after each drill')
    .option(
      '--no-outlier-ejection',
      'the stacks the drills start keep outliers in rotation (to measure what ejection is worth: docs/benchmarks.md)',
    )
    .option(
      '--retry-limit <n>',
      'retries of a room that failed before its first token, in the stacks the drills start (default 1; 0: none)',
      intArg('--retry-limit'),
    )
    .option(
      '--strict-targets',
      'fail the drill when a timing target (time to detect, recover, ready) is missed, not only an invariant',
    )
    .option(
      '--target <name=ms>',
      `hold a timing target to MS instead of the drill's own, e.g. --target 'time to detect=500' (repeat for more; one a drill does not report is ignored there): ${TIMING_TARGETS.join('; ')}`,
      targetArg,
      [],
    )
    .option(
      '--journal-events <n>',
      'kill-control-plane: fill the journal with about this many events first, to time a restart on a big journal',
      (v) => {
        if (!/^\d+$/.test(v) || Number(v) > 100_000_000)
          throw new UsageError(
            `--journal-events must be an integer from 0 to 100000000, got "${v}"`,
          );
        return Number(v);
      },
      0,
    )
    .option(
      '--postgres <url>',
      'control-plane-failover: create its journal database on this PostgreSQL server (the user needs CREATEDB); default: a throwaway cluster started with initdb',
    )
    .addOption(
      new Option('--log-level <level>', 'log level').choices([...LOG_LEVELS]).default('warn'),
    )
    .addHelpText(
      'after',
      `\nScenarios:\n${DRILLS.map((d) => `  ${d.name.padEnd(20)} ${d.summary}`).join('\n')}\n\n` +
        'Against a running stack (--url): the drill sees it only through its HTTP API, as an operator does.\n' +
        'Drills that inject faults need `pdctl serve --allow-fault-injection`; drills that signal engines\n' +
        '(kill-*, bus-loop-death) and `journal verify` need the stack on this host, run as the same user;\n' +
        'kill-control-plane, control-plane-failover and journal-unwritable need a stack the drill starts, and\n' +
        'are skipped. Admin routes take PDCTL_ADMIN_TOKEN when the server has one. There is no full-restart\n' +
        'baseline.\n' +
        '  npx pdctl serve --allow-fault-injection &\n' +
        '  npx pdctl drill all --url http://127.0.0.1:8080',
    )
    .action(async (scenario: string, o: DrillFlags) => {
      const chosen = scenario === 'all' ? DRILLS : DRILLS.filter((d) => d.name === scenario);
      if (o.url !== undefined && o.model !== undefined)
        throw new UsageError(
          '--model names the model of a stack the drill starts; with --url the drill uses whatever that stack serves',
        );
      if (o.model !== undefined) {
        try {
          checkModelFile(resolve(o.model));
        } catch (err) {
          throw new UsageError((err as Error).message);
        }
      }
      if (o.url !== undefined && o.journalEvents > 0)
        throw new UsageError(
          '--journal-events fills a journal the drill starts; it cannot be used with --url',
        );
      const reports =
        o.url === undefined
          ? await drillLocal(chosen, o)
          : await drillRemote(o.url, chosen, scenario === 'all', o);
      if (reports === null) return;
      if (o.json) printJson(scenario === 'all' ? reports : reports[0]);
      else if (reports.length > 1) print(renderSummary(reports));
      if (o.report) {
        mkdirSync(dirname(o.report), { recursive: true });
        writeFileSync(o.report, renderHtml(reports));
        if (!o.json) note(`report written to ${o.report}`);
      }
      process.exitCode = reports.every((r) => r.passed) ? EXIT.ok : EXIT.problem;
    });
}

/** Each drill on a stack of its own, its journal in --data-dir. */
async function drillLocal(chosen: readonly DrillScenario[], o: DrillFlags): Promise<DrillReport[]> {
  const log = processLogger('drill', o.logLevel);
  const reports: DrillReport[] = [];
  for (const d of chosen) {
    const journalPath = join(o.dataDir, `${d.name}-${Date.now()}.db`);
    if (!o.json) note(`drill ${d.name}: starting a stack (journal ${journalPath})`);
    const ran = await runDrill(d, {
      clients: o.clients ?? d.defaultClients ?? 8,
      journalPath,
      log,
      version: VERSION,
      baseline: o.baseline,
      journalEvents: o.journalEvents,
      postgresUrl: o.postgres,
      skipUnavailable: chosen.length > 1,
      model: o.model === undefined ? null : { path: resolve(o.model), sequences: o.sequences },
      strictTargets: o.strictTargets === true,
      progress: note,
      stack: {
        outlierEjection: o.outlierEjection !== false,
        ...(o.retryLimit === undefined ? {} : { retryLimit: o.retryLimit }),
      },
    });
    const report = held(ran, o);
    reports.push(report);
    if (!o.json) print(`${renderReport(report)}\n`);
  }
  return reports;
}

/**
 * The drills against the `pdctl serve` at `url`. Null when none could run (the server is
 * unreachable, or the one drill asked for cannot run against it): the exit code says which.
 */
async function drillRemote(
  url: string,
  chosen: readonly DrillScenario[],
  all: boolean,
  o: DrillFlags,
): Promise<DrillReport[] | null> {
  const log = processLogger('drill', o.logLevel);
  const reports: DrillReport[] = [];
  let target: RemoteTarget;
  try {
    target = await RemoteTarget.connect(url, process.env.PDCTL_ADMIN_TOKEN || null);
  } catch (err) {
    if (!(err instanceof TargetError)) throw err;
    note(`pdctl drill: ${err.message}`);
    process.exitCode = err.unreachable ? EXIT.unreachable : EXIT.usage;
    return null;
  }
  // Ctrl-C mid-drill: the stack runs on, so take back whatever fault the drill put into it.
  const onSignal = (sig: NodeJS.Signals) => {
    note(
      `pdctl drill: ${sig}: clearing the faults this drill injected at ${target.base}, then stopping`,
    );
    void target.clearFaults().then((missed) => {
      if (missed.length > 0)
        note(
          `pdctl drill: could not clear the faults of ${missed.join(', ')}: POST {"command":"inject_fault","reason":"none"} to ${target.base}/v1/admin/engines/ENGINE/commands`,
        );
      process.exit(EXIT.interrupted);
    });
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    for (const d of chosen) {
      const blocker = await remoteBlocker(d, target);
      if (blocker !== null) {
        if (!all) {
          note(`pdctl drill: ${d.name} cannot run against ${target.base}: ${blocker}`);
          process.exitCode = EXIT.usage;
          return null;
        }
        note(`drill ${d.name}: skipped: ${blocker}`);
        continue;
      }
      if (!o.json) note(`drill ${d.name}: against ${target.base} (journal ${target.journalPath})`);
      const ran = await runRemoteDrill(d, target, {
        clients: o.clients ?? d.defaultClients ?? 8,
        log,
        strictTargets: o.strictTargets === true,
      });
      const report = held(ran, o);
      reports.push(report);
      if (!o.json) print(`${renderReport(report)}\n`);
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await target.close();
  }
  return reports;
}
