/**
 * `pdctl serve`, step two: the flags as parsed (command.ts) become one typed `ServeOptions`,
 * checked once — the journal and where it is shown, retention and its archive, the planner, the
 * standby, the KV device, the engine keys, the engines' arguments — so that the stack (run.ts)
 * starts from values that already hold together, and a bad combination is one usage error first.
 */

import { resolve as resolvePath } from 'node:path';
import { isPostgresJournal, redactJournalUrl } from '../../app/journal.ts';
import { needsCurve, parseEngineKey } from '../../bus/admission.ts';
import { RELEASE_WINDOW_MS } from '../../control/rooms/orphans.ts';
import type { RouterPolicy } from '../../control/routing/router.ts';
import { UsageError } from '../../errors.ts';
import type { RetentionPolicy } from '../../journal/retention.ts';
import type { Durability } from '../../journal/store.ts';
import type { LogLevel } from '../../log.ts';
import type { PlannerOptions } from '../../planner/online.ts';
import { BANDS } from '../../room/events.ts';
import type { Band } from '../../tenants/book.ts';
import { formatAge, parseDuration } from '../../time.ts';
import { checkKvDevice, engineShapeArgs } from '../args.ts';
import { writableArchive } from '../context.ts';
import { withThreads } from '../model.ts';
import { plannerOf } from '../plan/serve-flags.ts';
import type { TlsFiles } from './tls.ts';

export interface ServeOptions {
  host: string;
  /** `--allow-open`: serve the network with no tenant and no admin token, on purpose. */
  allowOpen: boolean;
  /** `--tls-cert`, `--tls-key`: HTTPS with these files; null: plain HTTP. */
  tls: TlsFiles | null;
  port: number;
  bus: string;
  dataDir: string;
  /** A file path (resolved) or a postgres:// URL. */
  journalPath: string;
  onPostgres: boolean;
  /** The journal as messages show it: the URL without its password. */
  shownJournal: string;
  durability: Durability;
  retention: RetentionPolicy | undefined;
  planner: PlannerOptions;
  standby: boolean;
  leaseMs: number;
  kvDevice: number | undefined;
  /** `--engine-key ID=PUBLIC`, parsed. */
  engineKeys: Array<{ engine: string; key: string }>;
  curve: boolean;
  insecureBus: boolean;
  allowFaultInjection: boolean;
  prefill: number;
  decode: number;
  /** What every engine is started with: its shape, threads, fault injection. */
  engineArgs: string[];
  logLevel: LogLevel;
  restartStalled: boolean;
  outlierEjection: boolean;
  migrationLimit: number;
  retryLimit: number;
  maxRoomsPerEngine: number;
  router: RouterPolicy;
  routerOverlapWeight: number;
  kvBlockTokens: number;
  canaryDeadlineMs: number;
  canaryIntervalMs: number;
  api: {
    adminToken: string | null;
    requestTimeoutMs: number;
    maxConnections: number;
    admissionWaitMs: number;
    queueMax: number;
    queueTtlMs: Partial<Record<Band, number>>;
  };
  drainTimeoutMs: number;
  /** The model flags as parsed (`--model`, …), for `openModelInfo`. */
  modelFlags: Record<string, unknown>;
}

/** The flags as commander parsed them, checked together; throws a UsageError naming what is wrong. */
export function serveOptions(o: Record<string, unknown>): ServeOptions {
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
  const kvDevice = o.kvDevice as number | undefined;
  if (kvDevice !== undefined) checkKvDevice(kvDevice);
  const engineKeys = ((o.engineKey as string[] | undefined) ?? []).map((text) => {
    try {
      return parseEngineKey(text);
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
  });
  const prefill = o.prefill as number;
  const decode = o.decode as number;
  const engineArgs = engineShapeArgs(withThreads(o, prefill + decode));
  if (o.allowFaultInjection === true) engineArgs.push('--allow-fault-injection');
  return {
    host: o.host as string,
    allowOpen: o.allowOpen === true,
    tls: tlsFiles(o.tlsCert as string | undefined, o.tlsKey as string | undefined),
    port: o.port as number,
    bus: o.bus as string,
    dataDir: o.dataDir as string,
    journalPath,
    onPostgres,
    shownJournal: onPostgres ? redactJournalUrl(journalPath) : journalPath,
    durability: o.durability as Durability,
    retention,
    planner,
    standby: o.standby === true,
    leaseMs: o.leaseMs as number,
    kvDevice,
    engineKeys,
    curve: o.insecureBus !== true && needsCurve(o.bus as string),
    insecureBus: o.insecureBus === true,
    allowFaultInjection: o.allowFaultInjection === true,
    prefill,
    decode,
    engineArgs,
    logLevel: o.logLevel as LogLevel,
    restartStalled: o.restartStalled !== false,
    outlierEjection: o.outlierEjection !== false,
    migrationLimit: o.migrationLimit as number,
    retryLimit: o.retryLimit as number,
    maxRoomsPerEngine: o.maxRoomsPerEngine as number,
    router: o.router as RouterPolicy,
    routerOverlapWeight: o.routerOverlapWeight as number,
    kvBlockTokens: o.kvBlockTokens as number,
    canaryDeadlineMs: o.canaryDeadlineMs as number,
    canaryIntervalMs: o.canaryIntervalMs as number,
    api: {
      adminToken: process.env.PDCTL_ADMIN_TOKEN || null,
      requestTimeoutMs: o.requestTimeoutMs as number,
      maxConnections: o.maxConnections as number,
      admissionWaitMs: o.admissionWaitMs as number,
      queueMax: o.queueMax as number,
      queueTtlMs: (o.queueTtl as Partial<Record<Band, number>> | undefined) ?? {},
    },
    drainTimeoutMs: o.drainTimeoutMs as number,
    modelFlags: o,
  };
}

/** `--queue-ttl interactive=10s,batch=1m`: each band named, its time-to-live; others keep theirs. */
export function queueTtlArg(v: string): Partial<Record<Band, number>> {
  const out: Partial<Record<Band, number>> = {};
  for (const part of v.split(',')) {
    const [band, duration, ...rest] = part.trim().split('=');
    if (!BANDS.includes(band as Band) || duration === undefined || rest.length > 0)
      throw new UsageError(
        `--queue-ttl takes band=duration pairs, as interactive=10s,batch=1m (bands: ${BANDS.join(', ')}); got "${part}"`,
      );
    out[band as Band] = parseDuration(duration, `--queue-ttl ${band}`);
  }
  return out;
}

/** A band → ms map as `--queue-ttl` takes it, for help texts. */
export function queueTtlText(ttl: Record<Band, number>): string {
  return Object.entries(ttl)
    .map(([band, ms]) => `${band}=${formatAge(ms)}`)
    .join(',');
}

/** A `--retain` flag's parser: a duration of at least the window a room may await its release. */
export function retainArg(flag: string): (v: string) => number {
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

function tlsFiles(cert: string | undefined, key: string | undefined): TlsFiles | null {
  if (cert === undefined && key === undefined) return null;
  if (cert === undefined || key === undefined)
    throw new UsageError('--tls-cert and --tls-key go together: give both, or neither for HTTP');
  return { cert, key };
}
