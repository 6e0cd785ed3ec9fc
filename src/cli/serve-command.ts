/**
 * `pdctl serve`: the whole stack on one machine — the control plane with its embedded SQLite
 * journal, engine processes, the background canary and the HTTP API, wired by the composition
 * root (src/app/serving.ts). It reads the flags, listens, and on SIGTERM drains and exits 0.
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { hostname } from 'node:os';
import { dirname, resolve as resolvePath } from 'node:path';
import type { Command } from 'commander';
import { Option } from 'commander';
import { isPostgresJournal, redactJournalUrl } from '../app/journal.ts';
import { startServing } from '../app/serving.ts';
import { PACK_MIN_RETAIN_MS, packAfterFor } from '../app/stack.ts';
import {
  Admission,
  checkKey,
  type KeyPair,
  needsCurve,
  newKeyPair,
  parseEngineKey,
} from '../bus/admission.ts';
import { BusError } from '../bus/errors.ts';
import { CONTROL_DEFAULTS } from '../control/options.ts';
import { RELEASE_WINDOW_MS } from '../control/rooms/orphans.ts';
import { ROUTER_POLICIES, type RouterPolicy } from '../control/routing/router.ts';
import { UsageError } from '../errors.ts';
import { JournalError } from '../journal/errors.ts';
import type { RetentionPolicy } from '../journal/retention.ts';
import { DURABILITIES, type Durability } from '../journal/store.ts';
import {
  announce,
  announceFailure,
  LOG_FORMATS,
  LOG_LEVELS,
  type LogLevel,
  processLogger,
} from '../log.ts';
import { formatAge, formatDuration, parseDuration } from '../time.ts';
import { backends } from '../transfer/pool.ts';
import { checkKvDevice, engineShapeArgs, engineShapeOptions, intArg } from './args.ts';
import { EXIT, VERSION, writableArchive } from './context.ts';
import { openModelInfo, withThreads } from './model.ts';
import { plannerOf, plannerServeOptions } from './plan/serve-flags.ts';

const env = process.env;

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

async function runServe(o: Record<string, unknown>): Promise<void> {
  if (o.logFormat !== 'auto') process.env.PDCTL_LOG_FORMAT = o.logFormat as string;
  const log = processLogger('control', o.logLevel as LogLevel);
  /** Lines for the operator (where it listens, what to run next), in the log's format. */
  const say = (line: string) => announce('serve', line);
  // A taken HTTP port is known at once, not after the journal is open and both engines started.
  await httpPortFree(o.host as string, o.port as number);
  const journalPath =
    typeof o.journal === 'string' && o.journal !== ''
      ? isPostgresJournal(o.journal)
        ? o.journal
        : resolvePath(o.journal)
      : resolvePath(o.dataDir as string, 'journal.db');
  const onPostgres = isPostgresJournal(journalPath);
  const retention = retentionOf(
    o.retain as number | undefined,
    o.retainEvents as number | undefined,
    typeof o.archive === 'string' ? resolvePath(o.archive) : undefined,
  );
  if (retention?.archiveDir) writableArchive(retention.archiveDir);
  const planner = plannerOf(o);
  if (o.standby === true && !onPostgres) {
    throw new UsageError(
      '--standby needs a journal control planes can share: pass --journal postgres://…',
    );
  }
  const shownJournal = onPostgres ? redactJournalUrl(journalPath) : journalPath;
  // SIGTERM while standing by stops the wait; once serving, it drains (below).
  const standingBy = new AbortController();
  const stopWaiting = () => standingBy.abort();
  process.once('SIGTERM', stopWaiting);
  process.once('SIGINT', stopWaiting);
  if (o.kvDevice !== undefined) checkKvDevice(o.kvDevice as number);
  const admission = new Admission(loadServerKeys(resolvePath(o.dataDir as string, 'bus.key')));
  for (const text of (o.engineKey as string[] | undefined) ?? []) {
    let entry: ReturnType<typeof parseEngineKey>;
    try {
      entry = parseEngineKey(text);
      admission.allow(entry.engine, entry.key);
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    if (entry.engine === '*') {
      say(
        `pdctl serve: WARNING --engine-key *=${entry.key.slice(0, 8)}… lets that key speak for any engine id not yet registered (docs/security.md); give each engine a key of its own unless every holder is trusted`,
      );
    }
  }
  const curve = o.insecureBus !== true && needsCurve(o.bus as string);
  const model = await openModelInfo(o, log);
  const engineArgs = engineShapeArgs(withThreads(o, (o.prefill as number) + (o.decode as number)));
  if (o.allowFaultInjection === true) engineArgs.push('--allow-fault-injection');
  let serving: Awaited<ReturnType<typeof startServing>>;
  try {
    serving = await startServing({
      journalPath,
      leadership: onPostgres
        ? {
            leaseMs: o.leaseMs as number,
            holder: `${hostname()}:${process.pid} http ${o.host}:${o.port} bus ${o.bus}`,
            ...(o.standby === true
              ? {
                  standby: {
                    signal: standingBy.signal,
                    onWaiting: (leader) => {
                      say(
                        `pdctl serve: standing by: ${shownJournal} is led by ${leader.holder} (term ${leader.term}); taking over when it dies, freezes (lease ${o.leaseMs} ms) or stops`,
                      );
                      log.info(
                        { leader: leader.holder, term: leader.term },
                        'standing by for the journal',
                      );
                    },
                    onUnreachable: (err) => {
                      say(
                        `pdctl serve: standing by: ${err.message}; waiting for the database, then standing by again`,
                      );
                      log.warn({ err: err.message }, 'standby lost the journal database');
                    },
                  },
                }
              : {}),
          }
        : undefined,
      ...(model ? { model } : {}),
      durability: o.durability as Durability,
      bus: o.bus as string,
      admission,
      curve,
      log,
      version: VERSION,
      prefillEngines: o.prefill as number,
      decodeEngines: o.decode as number,
      engineArgs,
      engineLogLevel: o.logLevel as string,
      restartStalled: o.restartStalled !== false,
      outlierEjection: o.outlierEjection !== false,
      ...(retention ? { retention } : {}),
      planner,
      migrationLimit: o.migrationLimit as number,
      retryLimit: o.retryLimit as number,
      maxRoomsPerEngine: o.maxRoomsPerEngine as number,
      router: o.router as RouterPolicy,
      routerOverlapWeight: o.routerOverlapWeight as number,
      kvBlockTokens: o.kvBlockTokens as number,
      canaryDeadlineMs: o.canaryDeadlineMs as number,
      canaryIntervalMs: o.canaryIntervalMs as number,
      api: {
        adminToken: env.PDCTL_ADMIN_TOKEN || null,
        requestTimeoutMs: o.requestTimeoutMs as number,
        maxConnections: o.maxConnections as number,
        admissionWaitMs: o.admissionWaitMs as number,
      },
    });
  } catch (err) {
    // A taken bus port is a flag to change, like a taken HTTP port: exit 2, one line.
    if (err instanceof BusError && err.code === 'BUS_BIND_FAILED')
      throw new UsageError(err.message);
    if (standingBy.signal.aborted) {
      say('pdctl serve: stopped while standing by');
      return;
    }
    throw err;
  } finally {
    process.off('SIGTERM', stopWaiting);
    process.off('SIGINT', stopWaiting);
  }
  const { control } = serving.stack;
  let address: string;
  try {
    address = await serving.listen(o.host as string, o.port as number);
  } catch (err) {
    await serving.close(0);
    throw new UsageError(
      `cannot listen on ${o.host}:${o.port}: ${(err as Error).message}; pass another --port`,
    );
  }
  log.info(
    { http: address, bus: control.endpoint, journal: shownJournal },
    'pdctl serve listening',
  );
  const startedMs = Math.round(process.uptime() * 1000);
  log.info(
    {
      startedMs,
      orphansFailed: control.startup.orphansFailed,
      rebuildMs: control.startup.took,
      checkpointSeq: control.startup.checkpoint?.seq ?? null,
      foldedEvents: control.startup.folded,
    },
    'started',
  );
  say(
    `pdctl serve: listening on ${address} · bus ${control.endpoint} · journal ${shownJournal} · started in ${startedMs} ms${slowStart(control.startup.took, startedMs)}`,
  );
  const { journal } = serving.stack;
  if ('setHolder' in journal) {
    // Now that its addresses are bound, standbys and leader_terms can say where it is.
    await journal
      .setHolder(`${hostname()}:${process.pid} http ${address} bus ${control.endpoint}`)
      .catch((err: unknown) => log.warn({ err }, 'could not record where this leader is'));
  }
  if ('leadership' in journal) {
    const l = journal.leadership;
    say(
      `pdctl serve: leading the journal, term ${l.term} (${l.how === 'vacant' ? 'first leader' : `after ${l.previous}: ${l.how.replace('_', ' ')}`})`,
    );
  }
  const kept = serving.stack.retention.status().policy;
  const packAfter = packAfterFor(kept ?? undefined);
  const packing = onPostgres
    ? ''
    : packAfter === undefined
      ? `; rooms are not packed (pruned under ${formatAge(PACK_MIN_RETAIN_MS)} after they end, packing would not pay)`
      : `; each room packed into one row ${formatAge(packAfter)} after it ends`;
  say(
    kept === null
      ? `pdctl serve: the journal keeps every room (no --retain)${packing}; pdctl journal prune --url prunes it while serving`
      : `pdctl serve: journal retention: rooms ${formatAge(kept.roomsMs)} after they end, events of no room ${formatAge(kept.eventsMs ?? kept.roomsMs)}; a pass every ${formatAge(kept.everyMs)}; ${kept.archiveDir === null ? 'no archive' : `archived first to ${kept.archiveDir}`}${packing}`,
  );
  say(
    `pdctl serve: live page ${address}/ui · metrics ${address}/metrics · API docs ${address}/docs`,
  );
  say(
    `pdctl serve: bus ${curve ? 'encrypted with CURVE' : 'NOT encrypted'}; engines started by hand need PDCTL_CURVE_SERVER_KEY='${admission.server.publicKey}' and --engine-key ID=PUBLIC here`,
  );
  if (o.insecureBus === true)
    say(
      'pdctl serve: --insecure-bus: bus traffic (prompts, tokens) crosses the network in clear text; use it only where no one else can reach the bus',
    );
  if (o.kvDevice !== undefined)
    say(
      `pdctl serve: KV pages in the memory of CUDA device ${o.kvDevice} (${backends().cuda.reason})`,
    );
  if (o.allowFaultInjection === true)
    say(
      'pdctl serve: fault injection is ON (--allow-fault-injection): `pdctl drill --url` may stall, hang or corrupt these engines; never in production',
    );
  say(
    `try:  curl -s ${address}/v1/completions -H 'content-type: application/json' -d '{"model":"${control.modelInfo.name}","prompt":"the river","max_tokens":8}'`,
  );
  say(
    `then: npx pdctl rooms --journal ${onPostgres ? "'$PDCTL_JOURNAL'" : journalPath}   ·   ${address}/health/ready   ·   ${address}/docs`,
  );

  const deposed = await new Promise<string | null>((resolve) => {
    const stop = (sig: string) => {
      say(`pdctl serve: ${sig}: draining (at most ${o.drainTimeoutMs} ms)`);
      resolve(null);
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
    // Another control plane took the journal (this one froze past its lease, or lost the
    // database for longer): nothing it does would be journaled any more. Stop at once.
    if ('onDeposed' in journal) journal.onDeposed((why) => resolve(why));
  });
  if (deposed !== null) {
    say(
      `pdctl serve: no longer leads the journal (${deposed}); stopping, exit 3 — restart it with --standby to follow the new leader`,
    );
    log.error({ why: deposed }, 'deposed: stopping');
    await serving.close(0);
    process.exitCode = 3;
    return;
  }
  // Stop taking requests; give the ones in flight until the drain timeout, then cut them.
  await serving.close(o.drainTimeoutMs as number);
  say('pdctl serve: stopped');
}

/** Refuses a host and port another process listens on (port 0: any free one, always). */
async function httpPortFree(host: string, port: number): Promise<void> {
  if (port === 0) return;
  const probe = createServer();
  await new Promise<void>((resolve, reject) => {
    probe.once('error', (err) =>
      reject(
        new UsageError(`cannot listen on ${host}:${port}: ${err.message}; pass another --port`),
      ),
    );
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve()));
  });
}

/**
 * The control plane's bus key pair, kept in the data directory (mode 0600) so that engines
 * started by hand keep the same server key across restarts; made on first start.
 */
function loadServerKeys(path: string): KeyPair {
  if (existsSync(path)) {
    let keys: KeyPair;
    try {
      keys = JSON.parse(readFileSync(path, 'utf8')) as KeyPair;
      checkKey('publicKey', keys.publicKey);
      checkKey('secretKey', keys.secretKey);
    } catch (err) {
      throw new UsageError(
        `${path} is not a bus key file (${(err as Error).message}); move it away and pdctl serve makes a new one (engines started by hand then need the new PDCTL_CURVE_SERVER_KEY)`,
      );
    }
    return keys;
  }
  const keys = newKeyPair();
  try {
    // The data directory is its owner's alone, as the journal in it (journal/sqlite/privacy.ts).
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
    writeFileSync(path, `${JSON.stringify(keys, null, 2)}\n`, { mode: 0o600, flag: 'wx' });
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EROFS' || code === 'EACCES' || code === 'EPERM') {
      throw new JournalError(
        'JOURNAL_READ_ONLY',
        `cannot write ${path} (${(err as Error).message}): the data directory is on a read-only file or filesystem; pdctl serve keeps its journal and bus key there — fix the permissions or pass --data-dir on a writable disk. Read commands (pdctl rooms, journal verify) work on the journal as it is`,
        { cause: err },
      );
    }
    throw err;
  }
  return keys;
}

/** Where a slow start's time went (over 2 s): `(journal open 4.1s, prefix index 1.9s, …)`. */
function slowStart(took: Readonly<Record<string, number>>, startedMs: number): string {
  if (startedMs < 2000) return '';
  const steps = Object.entries(took)
    .filter(([, ms]) => ms >= 100)
    .sort(([, a], [, b]) => b - a)
    .map(
      ([name, ms]) =>
        `${name.replace(/Ms$/, '').replace(/[A-Z]/g, (c) => ` ${c.toLowerCase()}`)} ${formatDuration(ms)}`,
    );
  return steps.length > 0 ? ` (${steps.join(', ')})` : '';
}

/** A `--retain` flag's parser: a duration of at least the window a room may await its release. */
function retainArg(flag: string): (v: string) => number {
  return (v) => {
    const ms = parseDuration(v, flag);
    if (ms < RELEASE_WINDOW_MS)
      throw new UsageError(
        `${flag} ${v} is shorter than ${formatAge(RELEASE_WINDOW_MS)}: a room that ended may await an engine's release that long, and a restart needs it; pass ${formatAge(RELEASE_WINDOW_MS)} or more`,
      );
    return ms;
  };
}

/** The retention policy of `--retain` and `--retain-events`, or undefined without `--retain`. */
function retentionOf(
  roomsMs?: number,
  eventsMs?: number,
  archiveDir?: string,
): RetentionPolicy | undefined {
  if (roomsMs === undefined) {
    if (eventsMs !== undefined) throw new UsageError('--retain-events needs --retain');
    if (archiveDir !== undefined)
      throw new UsageError('--archive needs --retain: it keeps what retention prunes');
    return undefined;
  }
  if (eventsMs !== undefined && eventsMs < roomsMs)
    throw new UsageError(
      '--retain-events must be at least --retain: events of no room are kept at least as long as rooms',
    );
  return { roomsMs, eventsMs: eventsMs ?? roomsMs, archiveDir: archiveDir ?? null };
}
