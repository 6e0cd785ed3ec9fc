import type { Command } from 'commander';
import { Option } from 'commander';
import { FLOW_DEFAULTS } from '../../control/flow/flow-control.ts';
import { CONTROL_DEFAULTS } from '../../control/options.ts';
import { ROUTER_POLICIES } from '../../control/routing/router.ts';
import { UsageError } from '../../errors.ts';
import { JournalError } from '../../journal/errors.ts';
import { DURABILITIES } from '../../journal/store.ts';
import { announceFailure, LOG_FORMATS, LOG_LEVELS } from '../../log.ts';
import { engineShapeOptions, intArg } from '../args.ts';
import { EXIT } from '../context.ts';
import { plannerServeOptions } from '../plan/serve-flags.ts';
import { queueTtlArg, queueTtlText, retainArg } from './options.ts';
import { runServe } from './run.ts';

export function registerServeCommand(program: Command): void {
  const command = program
    .command('serve')
    .description(
      'Run the whole stack on this machine: the control plane (journal in --data-dir, or a PostgreSQL journal ' +
        'with --journal postgres://…), prefill and decode engine processes, and the HTTP API (OpenAI-compatible ' +
        'completions, room queries, health, metrics).',
    )
    .addOption(
      new Option('--host <host>', 'HTTP address to listen on')
        .env('PDCTL_HOST')
        .default('127.0.0.1'),
    )
    .option(
      '--allow-open',
      'serve a --host other than loopback with no tenant and no PDCTL_ADMIN_TOKEN: anyone who reaches it may run completions and read every room (refused without this flag)',
    )
    .addOption(
      new Option(
        '--tls-cert <file>',
        'serve the HTTP API over HTTPS with this certificate (PEM, chain after it); SIGHUP reads it and --tls-key again',
      ).env('PDCTL_TLS_CERT'),
    )
    .addOption(
      new Option('--tls-key <file>', "the certificate's private key (PEM)").env('PDCTL_TLS_KEY'),
    )
    .addOption(
      new Option('--port <port>', 'HTTP port (0: any free port)')
        .env('PDCTL_PORT')
        .default(8080)
        .argParser(intArg('--port')),
    )
    .addOption(
      new Option('--data-dir <dir>', 'where the journal lives (journal.db)')
        .env('PDCTL_DATA_DIR')
        .default('./data'),
    )
    .addOption(
      new Option(
        '--journal <path-or-url>',
        'the journal: a SQLite file (default: journal.db in --data-dir), or postgres://user:password@host:5432/db, which two or more control planes can share (one leads, the others stand by)',
      ).env('PDCTL_JOURNAL'),
    )
    .option(
      '--standby',
      'PostgreSQL journal: while another control plane leads it, wait and take over when that one dies, freezes or stops (without it: exit 3)',
    )
    .addOption(
      new Option(
        '--lease-ms <n>',
        "PostgreSQL journal: how long the leader's lease lasts unrenewed; a frozen leader is replaced after it",
      )
        .default(2000)
        .argParser(intArg('--lease-ms', 300)),
    )
    .addOption(
      new Option(
        '--bus <endpoint>',
        'bus endpoint engines connect to; tcp://0.0.0.0:PORT to accept engines from other hosts',
      )
        .env('PDCTL_BUS')
        .default('tcp://127.0.0.1:5557'),
    )
    .addOption(
      new Option('--durability <mode>', 'process or power (see docs/journal.md, "Durability")')
        .choices([...DURABILITIES])
        .default('power'),
    )
    .addOption(
      new Option(
        '--retain <age>',
        'prune the journal while serving: whole terminal rooms that ended longer ago than this (at least 5m), a small chunk per transaction between commits; default: keep everything (docs/journal.md, "Retention")',
      )
        .env('PDCTL_RETAIN')
        .argParser(retainArg('--retain')),
    )
    .addOption(
      new Option(
        '--archive <dir>',
        'with --retain: write what retention prunes to compressed hourly segment files in DIR first, readable with pdctl journal tail|rooms|room|stats --archive DIR',
      ).env('PDCTL_ARCHIVE'),
    )
    .addOption(
      new Option(
        '--retain-events <age>',
        'with --retain: keep events of no room (engine, recovery, system) this long, at least --retain (default: as long)',
      ).argParser(retainArg('--retain-events')),
    )
    .option(
      '--insecure-bus',
      'turn CURVE off on a tcp:// bus (traffic in clear; hellos are still signed); never across hosts',
    )
    .option(
      '--engine-key <id=public>',
      'let an engine started by hand (`pdctl engine`) join as ID with this public key (`*=PUBLIC`: any id); repeatable',
      (v: string, prev: string[] = []) => [...prev, v],
    )
    .option('--prefill <n>', 'prefill engine processes to spawn', intArg('--prefill'), 1)
    .option('--decode <n>', 'decode engine processes to spawn', intArg('--decode'), 1);
  plannerServeOptions(command);
  engineShapeOptions(command, ' per engine')
    .option(
      '--max-rooms-per-engine <n>',
      'rooms in flight per decode engine before 429',
      intArg('--max-rooms-per-engine', 1),
      512,
    )
    .addOption(
      new Option(
        '--router <policy>',
        "how a new room's engines are chosen: kv (the prefill engine holding most of its prompt's prefix blocks, against the prefill queued on it; docs/design.md §12), least-loaded (fewest rooms), round-robin",
      )
        .choices([...ROUTER_POLICIES])
        .default(CONTROL_DEFAULTS.router),
    )
    .option(
      '--router-overlap-weight <w>',
      'under --router kv: how much a prompt token to compute weighs against one already queued on the engine (above 1: requests stay with the engine holding their prefix against longer queues there)',
      (v: string) => {
        const w = Number(v);
        if (!/^\d+(\.\d+)?$/.test(v) || w <= 0 || w > 1000)
          throw new UsageError(
            `--router-overlap-weight must be a number above 0, at most 1000, got "${v}"`,
          );
        return w;
      },
      CONTROL_DEFAULTS.routerOverlapWeight,
    )
    .option(
      '--canary-interval-ms <n>',
      'background canary period (0: off)',
      intArg('--canary-interval-ms'),
      5000,
    )
    .option(
      '--canary-deadline-ms <n>',
      'canary deadline, also the default of /health/deep',
      intArg('--canary-deadline-ms', 10),
      2000,
    )
    .option(
      '--no-restart-stalled',
      'detect a stalled engine but do not take it up the escalation ladder (to watch a wedge)',
    )
    .option(
      '--no-outlier-ejection',
      'keep engines whose rooms keep failing by their fault in rotation (by default they get no rooms until a canary through them passes: docs/design.md §9)',
    )
    .option(
      '--allow-fault-injection',
      'let its engines accept inject_fault commands, for `pdctl drill --url` against this stack (never in production)',
    )
    .option(
      '--migration-limit <n>',
      'times one request may move to another engine pair when its engine dies (0: never; the request fails)',
      intArg('--migration-limit'),
      2,
    )
    .option(
      '--retry-limit <n>',
      'times one request is tried again on another engine pair when its room failed before any token reached the client (a failed prefill or transfer, a checksum mismatch, a refused reservation), the engine to blame left out; journaled as room.created retriedFrom (0: never; the client gets the failure)',
      intArg('--retry-limit'),
      1,
    )
    .option(
      '--request-timeout-ms <n>',
      'how long a client may take to send a whole request (headers and body); slower ones are cut off',
      intArg('--request-timeout-ms', 100),
      15_000,
    )
    .option(
      '--max-connections <n>',
      'open HTTP connections at most; more are closed as they arrive',
      intArg('--max-connections', 1),
      4096,
    )
    .option(
      '--admission-wait-ms <n>',
      'how long a request that finds no engine of a role (one restarting: about 2 s) waits for one before 503 no_engines; 0: at once',
      intArg('--admission-wait-ms'),
      3000,
    )
    .option(
      '--queue-max <n>',
      'requests waiting their turn at most (no pages free, no engine, a tenant at its limit); past it the batch band is shed first (429 queue_full); 0: none waits, refused at once',
      intArg('--queue-max'),
      FLOW_DEFAULTS.queueMax,
    )
    .option(
      '--queue-ttl <band=duration,...>',
      `how long a request of each band may wait for its turn before 429 (a client may ask for less with x-pdctl-queue-ttl-ms); default ${queueTtlText(FLOW_DEFAULTS.queueTtlMs)}`,
      queueTtlArg,
    )
    .option(
      '--drain-timeout-ms <n>',
      'on SIGTERM, how long in-flight requests may take to finish',
      intArg('--drain-timeout-ms'),
      15_000,
    )
    .addOption(
      new Option('--log-level <level>', 'log level').choices([...LOG_LEVELS]).default('info'),
    )
    .addOption(
      new Option(
        '--log-format <format>',
        'log lines: json (pino records, ISO times), pretty (one short line each), auto (pretty on a terminal); env PDCTL_LOG_FORMAT',
      )
        .choices([...LOG_FORMATS])
        .default('auto'),
    )
    .addHelpText(
      'after',
      '\nAdmin routes (abort, recovery commands) need PDCTL_ADMIN_TOKEN as a bearer token when it is set, and answer\n' +
        'only on loopback when it is not. Try it:\n' +
        '  npx pdctl serve\n' +
        '  curl -s localhost:8080/v1/completions -H "content-type: application/json" \\\n' +
        '       -d \'{"model":"pdctl-deterministic-1","prompt":"the river","max_tokens":8}\'',
    )
    .action(async (o: Record<string, unknown>) => {
      // Set for the engines it spawns too: one stream, one format.
      if (o.logFormat !== 'auto') process.env.PDCTL_LOG_FORMAT = o.logFormat as string;
      try {
        await runServe(o);
      } catch (err) {
        // Why it did not start is the stream's last line, in the stream's format (a JSON log
        // pipeline would otherwise end on a plain line it cannot parse).
        if (err instanceof UsageError) {
          announceFailure('serve', `pdctl: ${err.message}`);
          process.exitCode = EXIT.usage;
        } else if (err instanceof JournalError && err.code !== 'JOURNAL_BAD_QUERY') {
          announceFailure('serve', `pdctl: ${err.message} [${err.code}]`);
          process.exitCode = EXIT.journal;
        } else throw err;
      }
    });
}
