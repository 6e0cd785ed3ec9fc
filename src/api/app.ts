/**
 * `buildApi(deps)`: the fastify app — one plugin per group of routes (serving, queries, health,
 * operations, metrics, the live page at `/ui`), errors in OpenAI's shape, and the OpenAPI
 * document with Swagger UI at `/docs` (the document itself at `/docs/json`). It does not listen:
 * the composition root (src/app/serving.ts) does, and tests use `inject()` or a real port.
 */
import { randomUUID } from 'node:crypto';
import http from 'node:http';
import https from 'node:https';
import { createSecureContext } from 'node:tls';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import Fastify, { type FastifyInstance } from 'fastify';
import type { ControlPlane } from '../control/control-plane.ts';
import { ControlError } from '../control/errors.ts';
import type { Canary } from '../control/evidence/canary.ts';
import { FLOW_DEFAULTS, FlowControl } from '../control/flow/flow-control.ts';
import { RELEASE_WINDOW_MS } from '../control/rooms/orphans.ts';
import type { Retention } from '../journal/retention.ts';
import type { JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import type { Planner } from '../planner/online.ts';
import type { RecoveryView } from '../recovery/view.ts';
import type { EventInput } from '../room/events.ts';
import { isRequestId } from '../room/ids.ts';
import type { Band } from '../tenants/book.ts';
import { operatorsOnly, readerOf } from './access.ts';
import { adminRoutes } from './admin.ts';
import { API_ERRORS, COMPLETION_ROUTES, sendError, toApiError } from './errors.ts';
import { healthRoutes } from './health.ts';
import { journalAdminRoutes } from './journal-admin.ts';
import { type ApiMetrics, metricsRoutes } from './metrics.ts';
import { openAiRoutes, requestTenant } from './openai.ts';
import { plannerRoutes } from './planner.ts';
import { queryRoutes } from './queries.ts';
import { RefusalLog } from './refusals.ts';
import { SHARED_SCHEMAS } from './schemas.ts';
import { ShutdownGate } from './shutdown.ts';
import { tenantRoutes } from './tenants.ts';

/** A completion refused before a room existed: a refusal code of the catalogue (errors.ts). */
function isRefusal(route: string | undefined, code: string | null): boolean {
  return (
    (COMPLETION_ROUTES as readonly string[]).includes(route ?? '') &&
    code !== null &&
    (API_ERRORS as Record<string, { refusal?: boolean }>)[code]?.refusal === true
  );
}

import { UI_CLIENT_HEADER, uiRoutes } from './ui.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** The room serving this request now (a completion, once submitted); null for others. */
    room: (() => string) | null;
    /** A refusal the service chose (a 503): said on the request's access line, at warn. */
    refused: { code: string | null; reason: string; operator?: string } | null;
  }
}

/** Routes polled by machines: their successful answers are not worth an info line each. */
const PROBES = new Set(['/metrics', '/health', '/health/ready']);

export interface ApiOptions {
  control: ControlPlane;
  /** The journal the control plane writes: what the query routes read. */
  journal: JournalStore;
  canary: Canary;
  metrics: ApiMetrics;
  /** The escalation ladder's view of each engine; null when no stack supervises them. */
  recovery: RecoveryView | null;
  /** `/health/ready` ignores a background canary older than this. Default 30 000. */
  canaryStaleMs?: number;
  /** False when no background canary runs: readiness does not wait for one. */
  canaryBackground?: boolean;
  log: Logger;
  version: string;
  /** Bearer token for abort and admin routes; null: loopback only. */
  adminToken: string | null;
  /** HTTPS with this certificate and key (PEM); absent: plain HTTP. `reloadTls` replaces them. */
  tls?: TlsPair;
  /** Largest request body, bytes. Default 1 MiB. */
  bodyLimit?: number;
  /**
   * How long a client may take to send a whole request, headers and body (ms): a client that
   * trickles its body is cut off then. Streaming responses are not limited. Default 15 000.
   */
  requestTimeoutMs?: number;
  /** Open connections at most; more are closed as they arrive. Default 4096. */
  maxConnections?: number;
  /** What a graceful shutdown closes (src/app/serving.ts drives it); default: a gate of its own. */
  shutdown?: ShutdownGate;
  /** Journal retention (`POST /v1/admin/journal/prune`); absent: no such route. */
  retention?: Retention;
  /**
   * The shortest `olderThan` that route takes for a pass: `serve --retain`'s floor, the time a room
   * that ended may still await its engines' releases (control/rooms/orphans.ts). Default: that window.
   */
  pruneFloorMs?: number;
  /** The planner (`GET /v1/planner`); absent: no such route. */
  planner?: Pick<Planner, 'status'> & Partial<Pick<Planner, 'readQueue'>>;
  /** Where refusals are journaled; default: one over the control plane's journal. */
  refusals?: RefusalLog;
  /**
   * How long a completion that finds no engine of a role waits for one (an engine restart takes
   * about 2 s) before it is refused. Default 3000; 0: refused at once.
   */
  admissionWaitMs?: number;
  /** Completions waiting in flow control's queue at most; past it the lowest band is shed. */
  queueMax?: number;
  /** How long a completion of each band may wait for its turn; a client may ask for less. */
  queueTtlMs?: Partial<Record<Band, number>>;
}

/** A certificate (chain) and its private key, PEM. */
export interface TlsPair {
  cert: string;
  key: string;
}

/**
 * The HTTP (or, with `tls`, HTTPS) server behind fastify, with the limits that stop slow clients
 * from holding it.
 */
function boundedServer(o: ApiOptions) {
  const requestTimeout = o.requestTimeoutMs ?? 15_000;
  const limits = {
    requestTimeout,
    headersTimeout: Math.min(requestTimeout, 10_000),
    // How often node looks for requests past those timeouts (its default is 30 s).
    connectionsCheckingInterval: Math.min(1000, requestTimeout),
  };
  return (handler: http.RequestListener) => {
    const server = o.tls
      ? https.createServer({ ...limits, cert: o.tls.cert, key: o.tls.key }, handler)
      : http.createServer(limits, handler);
    server.maxConnections = o.maxConnections ?? 4096;
    return server;
  };
}

/**
 * Replaces an HTTPS server's certificate and key for the connections that come next (those open
 * keep theirs). The pair is checked first: one that does not load changes nothing and throws.
 */
export function reloadTls(app: FastifyInstance, tls: TlsPair): void {
  const server = app.server as unknown as https.Server;
  if (typeof server.setSecureContext !== 'function')
    throw new Error('the API serves plain HTTP: start it with a certificate to reload one');
  createSecureContext(tls);
  server.setSecureContext(tls);
}

export async function buildApi(o: ApiOptions): Promise<FastifyInstance> {
  const bodyLimit = o.bodyLimit ?? 1 << 20;
  const app = Fastify({
    serverFactory: boundedServer(o),
    bodyLimit,
    // Wrong types are errors, never coerced: "16" is not a max_tokens.
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false, allErrors: false } },
    logger: false,
    // The client's x-request-id when it sent a usable one, else a fresh one: echoed on every
    // answer, in the access log, and journaled on the room it created.
    genReqId: (req) => {
      const given = req.headers['x-request-id'];
      return typeof given === 'string' && isRequestId(given) ? given : randomUUID();
    },
  });
  // Answers are serialized as they are built: response schemas document and are tested against
  // real answers (test/api-schemas.e2e.test.ts), and never drop a field on the way out.
  app.setSerializerCompiler(() => (data) => JSON.stringify(data));
  for (const schema of SHARED_SCHEMAS) app.addSchema(schema);
  await app.register(swagger, {
    openapi: {
      info: {
        title: 'pdctl',
        version: o.version,
        description: 'Serving control plane for prefill/decode disaggregated LLM inference',
      },
      tags: [
        { name: 'serving', description: 'OpenAI-compatible completions' },
        { name: 'queries', description: 'Rooms, journal, engines' },
        { name: 'health', description: 'Liveness, readiness, canary' },
        {
          name: 'operations',
          description: 'Aborts, recovery commands, cordons and journal retention',
        },
      ],
      components: {
        securitySchemes: {
          bearer: {
            type: 'http',
            scheme: 'bearer',
            description:
              'PDCTL_ADMIN_TOKEN; when the server has none, operations answer only on loopback',
          },
        },
      },
    },
  });
  await app.register(swaggerUi, { routePrefix: '/docs' });
  app.decorateRequest('room', null);
  app.decorateRequest('refused', null);
  const append = (ev: EventInput) => o.control.journal.append(ev);
  const refusals = o.refusals ?? new RefusalLog(append, o.log);
  const waits = new RefusalLog(append, o.log, 1000, 100_000, 'request.waited');
  const flow = new FlowControl(
    {
      clock: o.control.clock,
      submit: (r) => o.control.submit(r),
      tokenize: (p) => o.control.modelInfo.tokenize(p),
      waited: (w) => {
        waits.waited(w.reason, w.requestId ?? 'unknown', w.waitedMs, Date.now(), w.tenant);
        o.metrics.waited(w.reason, w.waitedMs, w.tenant);
      },
    },
    {
      admissionWaitMs: o.admissionWaitMs ?? FLOW_DEFAULTS.admissionWaitMs,
      queueMax: o.queueMax ?? FLOW_DEFAULTS.queueMax,
      queueTtlMs: { ...FLOW_DEFAULTS.queueTtlMs, ...o.queueTtlMs },
    },
  );
  // A room event may have freed pages or a slot: the waiting are tried again.
  const unwake = o.control.onRoomEvent(() => flow.wake());
  o.metrics.watchFlow(flow);
  // The planner reads the queue, not only the rooms: waiting requests are demand without a room.
  o.planner?.readQueue?.(() => flow.demand());
  // What is gathered is written when the API closes, while the journal is still open.
  app.addHook('onClose', async () => {
    unwake();
    flow.close();
    await Promise.all([refusals.close(), waits.close()]);
  });
  app.setErrorHandler((err, req, reply) => {
    const e = toApiError(err, bodyLimit);
    // A refusal the service chose (503: journal unwritable, no engines) is a warning, once per
    // request, without a stack; anything else in 5xx is a bug worth the stack.
    const about = { requestId: req.id, url: req.url, room: req.room?.() ?? null };
    // Refused before any room existed: on the record (the journal, and a counter by reason).
    if ((e.status === 429 || e.status === 503) && isRefusal(req.routeOptions.url, e.code)) {
      refusals.note(e.code as string, e.status, req.id, e.message, Date.now(), requestTenant(req));
      o.metrics.refused(e.code as string, requestTenant(req));
    }
    if (e.status === 503) {
      // The client was told what a client can do; the operator's hint is for the log, on the
      // request's one access line (the finish hook below).
      const hint = err instanceof ControlError ? err.operatorHint : undefined;
      req.refused = { code: e.code, reason: e.message, ...(hint ? { operator: hint } : {}) };
    } else if (e.status >= 500) o.log.error({ ...about, err }, 'request failed');
    return sendError(reply, e);
  });
  app.setNotFoundHandler((req, reply) =>
    sendError(
      reply,
      toApiError({
        statusCode: 404,
        code: 'not_found',
        message: `no route ${req.method} ${req.url}; see GET /docs`,
      }),
    ),
  );
  // Every response counted by route pattern and status, streams included (they hijack the reply,
  // so the count is taken when the socket's response finishes).
  app.addHook('onRequest', async (req, reply) => {
    reply.header('x-request-id', req.id);
    const started = performance.now();
    reply.raw.once('finish', () => {
      const route = req.routeOptions.url ?? 'unmatched';
      const status = reply.raw.statusCode;
      o.metrics.response(route, status);
      // The access log: one line per answer, streams included, naming its room. The live page's
      // own polls (several a second while it is open) and the probes of a scraper or a load
      // balancer (every few seconds, for ever) are debug unless they failed.
      const quiet =
        status < 400 &&
        (route.startsWith('/ui') || req.headers[UI_CLIENT_HEADER] === 'ui' || PROBES.has(route));
      // A refusal the service chose is a warning, once per request, with why and, for the
      // operator, what to do.
      o.log[req.refused ? 'warn' : quiet ? 'debug' : 'info'](
        {
          requestId: req.id,
          method: req.method,
          url: req.url,
          status,
          ms: Math.round((performance.now() - started) * 10) / 10,
          room: req.room?.() ?? null,
          client: req.ip,
          ...(req.refused ?? {}),
        },
        'http',
      );
    });
  });
  const shutdown = o.shutdown ?? new ShutdownGate();
  // On SIGTERM nothing more is admitted: what still waits its turn is told to go elsewhere.
  shutdown.onClose(() =>
    flow.close(
      new ControlError(
        'CONTROL_CLOSED',
        'pdctl is shutting down: this request waited its turn and was not started; send it to another control plane',
      ),
    ),
  );
  await app.register(openAiRoutes, {
    control: o.control,
    metrics: o.metrics,
    modelId: o.control.modelInfo.name,
    shutdown,
    flow,
  });
  await app.register(queryRoutes, {
    control: o.control,
    journal: o.journal,
    recovery: o.recovery,
    metrics: o.metrics,
    ...(o.retention ? { retention: o.retention } : {}),
    adminToken: o.adminToken,
  });
  await app.register(healthRoutes, {
    control: o.control,
    canary: o.canary,
    recovery: o.recovery,
    canaryStaleMs: o.canaryStaleMs ?? 30_000,
    canaryBackground: o.canaryBackground ?? true,
    shutdown,
  });
  await app.register(adminRoutes, {
    control: o.control,
    journal: o.journal,
    token: o.adminToken,
    log: o.log,
  });
  await app.register(tenantRoutes, { control: o.control, token: o.adminToken });
  if (o.retention) {
    const deps = {
      journal: o.journal,
      retention: o.retention,
      token: o.adminToken,
      floorMs: o.pruneFloorMs ?? RELEASE_WINDOW_MS,
    };
    await app.register(journalAdminRoutes, deps);
  }
  if (o.planner)
    await app.register(plannerRoutes, {
      planner: o.planner,
      journal: o.journal,
      access: (req) => operatorsOnly(readerOf(req, o.adminToken, o.control.tenants), '/v1/planner'),
    });
  await app.register(metricsRoutes, { metrics: o.metrics });
  await app.register(uiRoutes);
  return app;
}
