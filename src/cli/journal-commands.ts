/** `pdctl journal …`: wires each verb's options to its command in src/cli/journal/. */
import type { Command } from 'commander';
import { READ_URL_HELP, readTarget } from './api-client.ts';
import { ARCHIVE_HELP, type CommonOptions } from './context.ts';
import { type BackupOptions, backupCommand } from './journal/backup.ts';
import { type ExportOptions, exportCommand } from './journal/export.ts';
import { migrateCommand } from './journal/migrate.ts';
import { type PruneOptions, pruneCommand } from './journal/prune.ts';
import { type StatsOptions, statsCommand } from './journal/stats.ts';
import { type SynthOptions, synthCommand } from './journal/synth.ts';
import { type TailOptions, tailCommand } from './journal/tail.ts';
import { verifyCommand } from './journal/verify.ts';

export function registerJournalCommands(
  program: Command,
  journalOption: (c: Command) => Command,
): void {
  const journal = program.command('journal').description('inspect and maintain the room journal');

  journalOption(
    journal
      .command('verify')
      .description(
        'check integrity and rebuild the rooms projection from events; exit 1 if anything differs',
      ),
  ).action(async (opts: CommonOptions) => {
    process.exitCode = await verifyCommand(opts);
  });

  journalOption(
    journal
      .command('tail')
      .description(
        'print the newest events (or the first ones from --since on), oldest first; --follow keeps printing new ones',
      )
      .option('-f, --follow', 'keep printing events as they are committed')
      .option(
        '--type <types>',
        'comma-separated event types or families (room.failed, engine, recovery.*)',
      )
      .option('--room <id>', 'only this room')
      .option('--engine <id>', 'only events from this engine')
      .option(
        '--since <time>',
        'start at this time and print the first events from then on (ISO-8601, 10m, 03:12, unix ms)',
      )
      .option('-n, --limit <n>', 'events to print first (1-10000)', '50')
      .option('--interval-ms <ms>', 'poll interval with --follow (of a journal file)', '250')
      .option('--url <url>', READ_URL_HELP)
      .option('--archive <dir>', ARCHIVE_HELP),
  ).action(async (opts: TailOptions, cmd: Command) => {
    const target = readTarget(opts, cmd);
    process.exitCode = await tailCommand({
      ...opts,
      url: 'url' in target ? target.url : undefined,
    });
  });

  journalOption(
    journal
      .command('stats')
      .description(
        'counts: events, rooms by state, failures and aborts by reason; --per-minute for a window',
      )
      .option('--per-minute', 'transitions per minute by state entered and reason')
      .option(
        '--since <time>',
        'window start for --per-minute (default: 15 minutes before the newest event)',
      )
      .option('--until <time>', 'window end for --per-minute (default: the newest event)')
      .option('--url <url>', `${READ_URL_HELP}; the counts of /v1/stats, without --per-minute`)
      .option('--archive <dir>', ARCHIVE_HELP),
  ).action(async (opts: StatsOptions, cmd: Command) => {
    const target = readTarget(opts, cmd);
    process.exitCode = await statsCommand({
      ...opts,
      url: 'url' in target ? target.url : undefined,
    });
  });

  journalOption(
    journal
      .command('prune')
      .description(
        'delete whole terminal rooms that ended longer ago than --older-than, never a live room; on a journal no control plane writes, or with --url through the serving one',
      )
      .requiredOption('--older-than <age>', 'e.g. 7d, 12h')
      .option(
        '--events-older-than <age>',
        'also delete events of no room (engine, recovery, system) older than this, at least --older-than; default: keep them',
      )
      .option(
        '--chunk <rooms>',
        'rooms per transaction, so readers and appends never wait long behind it (default 500; with --url 25)',
      )
      .option('--dry-run', 'count what would be deleted, change nothing')
      .option(
        '--archive <dir>',
        'write what it deletes to compressed hourly segment files in DIR first (docs/journal.md, "Archive"); with --url the server archives where its own --archive says',
      )
      .option(
        '--url <url>',
        'ask the pdctl serve there to prune through its own writer (its journal is busy while it serves), and follow the pass to its end',
      ),
  ).action(async (opts: PruneOptions) => {
    process.exitCode = await pruneCommand(opts);
  });

  journalOption(
    journal
      .command('synth')
      .description(
        'write a realistic synthetic journal through the real append path, for trying queries and benchmarks',
      )
      .requiredOption('--rooms <n>', 'number of requests to simulate')
      .option('--seed <n>', 'random seed; the same seed gives the same rooms', '1')
      .option('--span <duration>', 'time span the rooms arrive over', '1h')
      .option('--end <time>', 'when the span ends; rooms still running then stay in flight', 'now')
      .option('--prefill <ids>', 'prefill engine ids', 'p0,p1')
      .option('--decode <ids>', 'decode engine ids', 'd0,d1')
      .option('--incidents <n>', 'engine stalls of 15-30 s, with the rooms they fail', '1')
      .option(
        '--durability <level>',
        'process or power (see docs/journal.md, "Durability")',
        'power',
      ),
  ).action(async (opts: SynthOptions) => {
    process.exitCode = await synthCommand(opts);
  });

  journalOption(
    journal
      .command('backup')
      .description(
        'copy the journal consistently, even while pdctl is writing it (plain cp of a live WAL database is not safe)',
      )
      .requiredOption('--to <file>', 'where to write the copy')
      .option('--force', 'overwrite --to if it exists'),
  ).action(async (opts: BackupOptions) => {
    process.exitCode = await backupCommand(opts);
  });

  journalOption(
    journal
      .command('export')
      .description(
        "an incident's window as a journal of its own: every room whose life overlaps it, with all its events, and the engines' and recovery's events inside it (safe while pdctl writes)",
      )
      .requiredOption(
        '--since <time>',
        'window start: ISO-8601, an age (2h), a UTC clock time (03:10), unix ms',
      )
      .option('--until <time>', 'window end (same forms)', 'now')
      .requiredOption('--to <file>', 'where to write the exported journal')
      .option('--force', 'overwrite --to if it exists'),
  ).action(async (opts: ExportOptions) => {
    process.exitCode = await exportCommand(opts);
  });

  journalOption(
    journal
      .command('migrate')
      .description('upgrade a journal written by an older pdctl to this schema, in place'),
  ).action(async (opts: CommonOptions) => {
    process.exitCode = await migrateCommand(opts);
  });
}
