/** The `pdctl` command line: the composition root of every CLI process. */
import { Command, CommanderError, Option } from 'commander';
import { UsageError } from '../errors.ts';
import { JournalError } from '../journal/errors.ts';
import { DEFAULT_JOURNAL, EXIT, VERSION } from './context.ts';
import { registerDrillCommand } from './drill-command.ts';
import { registerEngineCommand } from './engine-command.ts';
import { registerEnginesCommand } from './engines-command.ts';
import { registerJournalCommands } from './journal-commands.ts';
import { registerKeysCommand } from './keys-command.ts';
import { registerAbortCommand } from './ops-commands.ts';
import { registerPlanCommand } from './plan/command.ts';
import { registerRoomCommands } from './rooms-commands.ts';
import { registerRunCommand } from './run-command.ts';
import { registerServeCommand } from './serve/command.ts';
import { registerTenantsCommand } from './tenants-command.ts';
import { registerUsageCommand } from './usage-command.ts';

function journalOption(c: Command): Command {
  return c
    .addOption(
      new Option('--journal <path>', 'journal file (env PDCTL_JOURNAL)').default(DEFAULT_JOURNAL),
    )
    .option('--json', 'machine-readable output');
}

export function buildProgram(): Command {
  const program = new Command('pdctl')
    .version(VERSION)
    .description(
      'pdctl — control plane for prefill/decode disaggregated LLM serving, with a durable room journal. ' +
        'Every room transition, abort and KV transfer is committed to a SQLite journal before anyone acts on it; ' +
        'these commands answer "what happened to room X" and "what was in flight at 03:12" after an incident.',
    )
    .showHelpAfterError('(run with --help for usage)')
    .addHelpText(
      'after',
      '\nExit codes: 0 ok · 1 the command found a problem (verify failed, no such room) · 2 bad usage · 3 the journal could not be opened · 4 the server (--url) could not be reached · 130 interrupted\n' +
        'Times are UTC. Examples:\n' +
        '  pdctl journal synth --rooms 10000        # try the queries on a realistic journal\n' +
        '  pdctl rooms --in-flight-at 03:12         # what was in flight at 03:12 UTC\n' +
        '  pdctl rooms --state failed --since 1h    # what failed in the last hour, and why\n' +
        '  pdctl room r-mf3k2a9x-0001c4             # one room, event by event\n' +
        '  pdctl journal tail -f --type room.failed # watch failures live',
    );
  registerJournalCommands(program, journalOption);
  registerRoomCommands(program, journalOption);
  registerPlanCommand(program, journalOption);
  registerServeCommand(program);
  registerRunCommand(program);
  registerEngineCommand(program);
  registerEnginesCommand(program);
  registerAbortCommand(program);
  registerKeysCommand(program);
  registerTenantsCommand(program, journalOption);
  registerUsageCommand(program, journalOption);
  registerDrillCommand(program);
  return program;
}

export async function main(argv: string[]): Promise<number> {
  const program = buildProgram();
  program.exitOverride();
  program.configureOutput({ writeErr: (s) => process.stderr.write(s) });
  for (const c of program.commands) {
    c.exitOverride();
    for (const sub of c.commands) sub.exitOverride();
  }
  try {
    await program.parseAsync(argv);
    return typeof process.exitCode === 'number' ? process.exitCode : EXIT.ok;
  } catch (err) {
    if (err instanceof CommanderError) {
      if (
        err.code === 'commander.helpDisplayed' ||
        err.code === 'commander.version' ||
        err.code === 'commander.help'
      )
        return EXIT.ok;
      return EXIT.usage;
    }
    if (err instanceof UsageError) {
      process.stderr.write(`pdctl: ${err.message}\n`);
      return EXIT.usage;
    }
    if (err instanceof JournalError) {
      process.stderr.write(`pdctl: ${err.message} [${err.code}]\n`);
      return err.code === 'JOURNAL_BAD_QUERY' || err.code === 'JOURNAL_INVALID_EVENT'
        ? EXIT.usage
        : EXIT.journal;
    }
    process.stderr.write(`pdctl: unexpected error: ${(err as Error)?.stack ?? String(err)}\n`);
    return EXIT.problem;
  }
}
