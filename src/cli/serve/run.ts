/**
 * `pdctl serve`, step three: the stack from `ServeOptions` (options.ts) — keys, model, the serving
 * stack of src/app/serving.ts, the HTTP listener — then what the operator is told, and on
 * SIGTERM a drain. A standby waits here for the journal's lead.
 */
import { hostname } from 'node:os';
import { resolve as resolvePath } from 'node:path';
import { startServing } from '../../app/serving.ts';
import { PACK_MIN_RETAIN_MS, packAfterFor } from '../../app/stack.ts';
import { BusError } from '../../bus/errors.ts';
import { UsageError } from '../../errors.ts';
import { announce, type LogLevel, processLogger } from '../../log.ts';
import { formatAge, formatDuration } from '../../time.ts';
import { backends } from '../../transfer/pool.ts';
import { VERSION } from '../context.ts';
import { openModelInfo } from '../model.ts';
import { admissionFor } from './keys.ts';
import { serveOptions } from './options.ts';
import { httpPortFree, notOpenByMistake } from './preflight.ts';
import { readTls, reloadOnSighup } from './tls.ts';

export async function runServe(flags: Record<string, unknown>): Promise<void> {
  const log = processLogger('control', flags.logLevel as LogLevel);
  /** Lines for the operator (where it listens, what to run next), in the log's format. */
  const say = (line: string) => announce('serve', line);
  const s = serveOptions(flags);
  const tls = s.tls ? readTls(s.tls) : null;
  await notOpenByMistake({ ...s, adminToken: s.api.adminToken });
  // A taken HTTP port is known at once, not after the journal is open and both engines started.
  await httpPortFree(s.host, s.port);
  const { onPostgres, journalPath, shownJournal } = s;
  // SIGTERM while standing by stops the wait; once serving, it drains (below).
  const standingBy = new AbortController();
  const stopWaiting = () => standingBy.abort();
  process.once('SIGTERM', stopWaiting);
  process.once('SIGINT', stopWaiting);
  const admission = admissionFor(resolvePath(s.dataDir, 'bus.key'), s.engineKeys, say);
  const { curve } = s;
  const model = await openModelInfo(s.modelFlags, log);
  let serving: Awaited<ReturnType<typeof startServing>>;
  try {
    serving = await startServing({
      journalPath,
      leadership: onPostgres
        ? {
            leaseMs: s.leaseMs,
            holder: `${hostname()}:${process.pid} http ${s.host}:${s.port} bus ${s.bus}`,
            ...(s.standby
              ? {
                  standby: {
                    signal: standingBy.signal,
                    onWaiting: (leader) => {
                      say(
                        `pdctl serve: standing by: ${shownJournal} is led by ${leader.holder} (term ${leader.term}); taking over when it dies, freezes (lease ${s.leaseMs} ms) or stops`,
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
      model,
      durability: s.durability,
      bus: s.bus,
      admission,
      curve,
      log,
      version: VERSION,
      prefillEngines: s.prefill,
      decodeEngines: s.decode,
      engineArgs: s.engineArgs,
      engineLogLevel: s.logLevel,
      restartStalled: s.restartStalled,
      outlierEjection: s.outlierEjection,
      ...(s.retention ? { retention: s.retention } : {}),
      planner: s.planner,
      migrationLimit: s.migrationLimit,
      retryLimit: s.retryLimit,
      maxRoomsPerEngine: s.maxRoomsPerEngine,
      router: s.router,
      routerOverlapWeight: s.routerOverlapWeight,
      kvBlockTokens: s.kvBlockTokens,
      canaryDeadlineMs: s.canaryDeadlineMs,
      canaryIntervalMs: s.canaryIntervalMs,
      api: { ...s.api, ...(tls ? { tls } : {}) },
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
    address = await serving.listen(s.host, s.port);
  } catch (err) {
    await serving.close(0);
    throw new UsageError(
      `cannot listen on ${s.host}:${s.port}: ${(err as Error).message}; pass another --port`,
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
  if (s.insecureBus)
    say(
      'pdctl serve: --insecure-bus: bus traffic (prompts, tokens) crosses the network in clear text; use it only where no one else can reach the bus',
    );
  if (s.kvDevice !== undefined)
    say(
      `pdctl serve: KV pages in the memory of CUDA device ${s.kvDevice} (${backends().cuda.reason})`,
    );
  if (s.allowFaultInjection)
    say(
      'pdctl serve: fault injection is ON (--allow-fault-injection): `pdctl drill --url` may stall, hang or corrupt these engines; never in production',
    );
  const tenants = control.tenants.list();
  const key = control.tenants.closed ? ` -H "Authorization: Bearer $KEY"` : '';
  if (control.tenants.closed)
    say(
      `pdctl serve: the serving routes need a tenant's key (${tenants.filter((t) => t.revokedAt === null).length} of ${tenants.length} tenants live): pdctl tenants list --url ${address}`,
    );
  say(
    `try:  curl -s ${address}/v1/completions${key} -H 'content-type: application/json' -d '{"model":"${control.modelInfo.name}","prompt":"the river","max_tokens":8}'`,
  );
  say(
    `then: npx pdctl rooms --journal ${onPostgres ? "'$PDCTL_JOURNAL'" : journalPath}   ·   ${address}/health/ready   ·   ${address}/docs`,
  );

  const stopReloading = s.tls ? reloadOnSighup(s.tls, (t) => serving.reloadTls(t), log) : null;
  if (tls)
    say(`pdctl serve: HTTPS with ${tls.subject}, valid to ${tls.validTo}; SIGHUP reloads it`);
  const deposed = await new Promise<string | null>((resolve) => {
    const stop = (sig: string) => {
      say(`pdctl serve: ${sig}: draining (at most ${s.drainTimeoutMs} ms)`);
      resolve(null);
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
    // Another control plane took the journal (this one froze past its lease, or lost the
    // database for longer): nothing it does would be journaled any more. Stop at once.
    if ('onDeposed' in journal) journal.onDeposed((why) => resolve(why));
  });
  stopReloading?.();
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
  await serving.close(s.drainTimeoutMs);
  say('pdctl serve: stopped');
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
