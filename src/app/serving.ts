/**
 * A stack with the serving API in front of it: the stack (stack.ts), the background canary, the
 * Prometheus metrics and the fastify app, wired once. `pdctl serve`, the drills and
 * `bench:serve` all start the serving process through here.
 */
import type { FastifyInstance } from 'fastify';
import { type ApiOptions, buildApi, reloadTls, type TlsPair } from '../api/app.ts';
import { readiness } from '../api/health.ts';
import { ApiMetrics } from '../api/metrics.ts';
import { SHUTDOWN_REASON, ShutdownGate } from '../api/shutdown.ts';
import { Canary } from '../control/evidence/canary.ts';
import { SqliteJournal } from '../journal/sqlite/journal.ts';
import { type Stack, type StackOptions, startStack } from './stack.ts';

/** After the drain deadline: how long cut streams get to write their last event. */
const CUT_GRACE_MS = 2000;

export interface ServingOptions extends StackOptions {
  /** The HTTP side: admin token and limits (see ApiOptions). */
  api?: Pick<
    ApiOptions,
    | 'adminToken'
    | 'bodyLimit'
    | 'requestTimeoutMs'
    | 'maxConnections'
    | 'canaryStaleMs'
    | 'admissionWaitMs'
    | 'queueMax'
    | 'queueTtlMs'
    | 'pruneFloorMs'
    | 'tls'
  >;
  /** Deadline of a canary room, and the default of `/health/deep`. Default 2000 ms. */
  canaryDeadlineMs?: number;
  /** Background canary period once listening; 0: none. Default 5000 ms. */
  canaryIntervalMs?: number;
}

export interface Serving {
  stack: Stack;
  app: FastifyInstance;
  canary: Canary;
  metrics: ApiMetrics;
  /** Listens, then starts the background canary; resolves to the address, e.g. `http://127.0.0.1:8080`. */
  listen(host: string, port: number): Promise<string>;
  /** HTTPS: the certificate and key for new connections (checked first; throws, changing nothing). */
  reloadTls(tls: TlsPair): void;
  /** What `/health/ready` would answer now. */
  ready(): boolean;
  /**
   * Stops taking requests, gives those in flight `drainTimeoutMs` (default 15 000) before their
   * connections are cut, then stops the engines and the control plane. Idempotent.
   */
  close(drainTimeoutMs?: number): Promise<void>;
}

export async function startServing(o: ServingOptions): Promise<Serving> {
  const stack = await startStack(o);
  const { control, journal, recovery } = stack;
  const log = o.log;
  const canary = new Canary(control, log, o.canaryDeadlineMs ?? 2000);
  const metrics = new ApiMetrics(control, recovery, stack.retention, stack.planner);
  canary.onResult = (r) => {
    metrics.canary(r.ok, r.stage);
    // The first canary's answer: the stack is up, and the journal's after-start scan may begin.
    if (journal instanceof SqliteJournal) journal.scanNow();
  };
  const canaryStaleMs = o.api?.canaryStaleMs ?? 30_000;
  const canaryEvery = o.canaryIntervalMs ?? 5000;
  const canaryBackground = canaryEvery > 0;
  const shutdown = new ShutdownGate();
  let app: FastifyInstance;
  try {
    app = await buildApi({
      shutdown,
      ...o.api,
      control,
      journal,
      canary,
      metrics,
      recovery,
      retention: stack.retention,
      ...(stack.planner.mode !== 'off' ? { planner: stack.planner } : {}),
      log,
      version: o.version,
      adminToken: o.api?.adminToken ?? null,
      canaryStaleMs,
      canaryBackground,
    });
  } catch (err) {
    await stack.stop();
    throw err;
  }
  let closing: Promise<void> | null = null;
  const close = (drainTimeoutMs = 15_000) => {
    closing ??= (async () => {
      await canary.stop();
      // The listener stays open while requests finish: new completions get 503 with
      // Retry-After and readiness says why, so a load balancer moves traffic away.
      shutdown.close();
      if (!(await shutdown.idle(drainTimeoutMs))) {
        // The drain deadline: the rooms still running are aborted as `shutdown` — their streams
        // end with an error event saying so — and get a moment to say it before sockets close.
        const rooms = shutdown.rooms();
        log.warn(
          { rooms: rooms.length, drainTimeoutMs },
          'drain deadline: aborting the rooms in flight',
        );
        await Promise.all(
          rooms.map((room) => control.abort(room, SHUTDOWN_REASON, 'control').catch(() => {})),
        );
        await shutdown.idle(CUT_GRACE_MS);
      }
      const closed = app.close();
      const cut = setTimeout(() => app.server.closeAllConnections(), CUT_GRACE_MS);
      await closed;
      clearTimeout(cut);
      await stack.stop();
    })();
    return closing;
  };
  return {
    stack,
    app,
    canary,
    metrics,
    reloadTls: (tls) => reloadTls(app, tls),
    async listen(host, port) {
      const listened = await app.listen({ host, port });
      // fastify names the scheme by its own https option, which a server of ours does not set.
      const address = o.api?.tls ? listened.replace(/^http:/, 'https:') : listened;
      if (canaryBackground) canary.start(canaryEvery);
      return address;
    },
    ready: () =>
      readiness({
        control,
        canary,
        recovery,
        canaryStaleMs,
        canaryBackground,
        shutdown,
      }).ready,
    close,
  };
}
