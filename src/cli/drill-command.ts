/** `pdctl drill <scenario>`: replay a failure against a live stack and check every invariant. */
import { join } from 'node:path';
import type { Command } from 'commander';
import { Argument, Option } from 'commander';
import { startStack } from '../control/stack.ts';
import { LOG_LEVELS, type LogLevel, processLogger } from '../log.ts';
import { abortCascade } from '../recovery/drills/abort-cascade.ts';
import { renderReport } from '../recovery/drills/report.ts';
import { EXIT, note, print, printJson, VERSION } from './context.ts';
import { UsageError } from './time.ts';

const SCENARIOS = ['abort-cascade'] as const;

export function registerDrillCommand(program: Command): void {
  program
    .command('drill')
    .description(
      'Run a crash-recovery drill against a stack it starts (journal in --data-dir): apply load, inject the ' +
        'fault, then check and print every invariant with its figure. Exit 0 when every invariant holds.',
    )
    .addArgument(new Argument('<scenario>', 'the failure to replay').choices([...SCENARIOS]))
    .option(
      '--clients <n>',
      'streaming clients',
      (v) => {
        if (!/^\d+$/.test(v) || Number(v) < 1 || Number(v) > 10_000)
          throw new UsageError(`--clients must be an integer from 1 to 10000, got "${v}"`);
        return Number(v);
      },
      200,
    )
    .option('--data-dir <dir>', 'where the drill journal goes', './data/drills')
    .option('--json', 'the report as one JSON object')
    .addOption(
      new Option('--log-level <level>', 'log level').choices([...LOG_LEVELS]).default('warn'),
    )
    .action(
      async (
        scenario: (typeof SCENARIOS)[number],
        o: { clients: number; dataDir: string; json?: boolean; logLevel: LogLevel },
      ) => {
        const log = processLogger('drill', o.logLevel);
        const journalPath = join(o.dataDir, `${scenario}-${Date.now()}.db`);
        if (!o.json) note(`drill ${scenario}: starting a stack (journal ${journalPath})`);
        const stack = await startStack({
          journalPath,
          durability: 'power',
          log,
          version: VERSION,
          engineLogLevel: o.logLevel,
          // Slow enough that rooms are spread over every stage when the clients drop.
          engineArgs: [
            '--pages',
            '65536',
            '--prefill-us-per-token',
            '200',
            '--decode-us-per-token',
            '2000',
          ],
        });
        let passed = false;
        try {
          await stack.control.journal.append({
            type: 'drill.started',
            source: 'drill',
            data: { scenario, clients: o.clients },
          });
          const report = await abortCascade(stack, { clients: o.clients, targetMs: 2000 }, log);
          passed = report.passed;
          await stack.control.journal.append({
            type: 'drill.finished',
            source: 'drill',
            data: {
              scenario,
              passed,
              invariants: report.invariants.map((i) => ({
                name: i.name,
                ok: i.ok,
                figure: i.figure,
              })),
            },
          });
          if (o.json) printJson({ ...report, journal: journalPath });
          else print(renderReport(report));
        } finally {
          await stack.stop();
        }
        process.exitCode = passed ? EXIT.ok : EXIT.problem;
      },
    );
}
