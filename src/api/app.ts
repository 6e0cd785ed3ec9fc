/**
 * `buildApi(deps)`: the fastify app with every route, error handling in OpenAI's shape, and the
 * OpenAPI document at `/docs`. It does not listen: `pdctl serve` (the composition root) does, and
 * tests use `inject()` or a real port.
 */
import http from 'node:http';
import swagger from '@fastify/swagger';
import Fastify, { type FastifyInstance } from 'fastify';
import type { Canary } from '../control/canary.ts';
import type { ControlPlane } from '../control/control-plane.ts';
import type { Logger } from '../log.ts';
import { registerAdminRoutes } from './admin.ts';
import { sendError, toApiError } from './errors.ts';
import { registerHealthRoutes } from './health.ts';
import type { ApiMetrics } from './metrics.ts';
import { registerOpenAiRoutes } from './openai.ts';
import { registerQueryRoutes } from './queries.ts';

export interface ApiOptions {
  control: ControlPlane;
  canary: Canary;
  metrics: ApiMetrics;
  log: Logger;
  version: string;
  /** Bearer token for abort and admin routes; null: loopback only. */
  adminToken: string | null;
  /** Live rooms per decode engine before 429. Default 512. */
  maxRoomsPerEngine?: number;
  /** Largest request body, bytes. Default 1 MiB. */
  bodyLimit?: number;
  /**
   * How long a client may take to send a whole request, headers and body (ms): a client that
   * trickles its body is cut off then. Streaming responses are not limited. Default 15 000.
   */
  requestTimeoutMs?: number;
  /** Open connections at most; more are closed as they arrive. Default 4096. */
  maxConnections?: number;
}

/** The HTTP server behind fastify, with the limits that stop slow clients from holding it. */
function boundedServer(o: ApiOptions) {
  const requestTimeout = o.requestTimeoutMs ?? 15_000;
  return (handler: http.RequestListener) => {
    const server = http.createServer(
      {
        requestTimeout,
        headersTimeout: Math.min(requestTimeout, 10_000),
        // How often node looks for requests past those timeouts (its default is 30 s).
        connectionsCheckingInterval: Math.min(1000, requestTimeout),
      },
      handler,
    );
    server.maxConnections = o.maxConnections ?? 4096;
    return server;
  };
}

export async function buildApi(o: ApiOptions): Promise<FastifyInstance> {
  const app = Fastify({
    serverFactory: boundedServer(o),
    bodyLimit: o.bodyLimit ?? 1 << 20,
    // Wrong types are errors, never coerced: "16" is not a max_tokens.
    ajv: { customOptions: { coerceTypes: false, removeAdditional: false, allErrors: false } },
    logger: false,
  });
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
        { name: 'operations', description: 'Aborts and recovery commands' },
      ],
    },
  });
  app.setErrorHandler((err, req, reply) => {
    const e = toApiError(err);
    // A refusal the service chose (503: journal unwritable, no engines) is a warning, once per
    // request, without a stack; anything else in 5xx is a bug worth the stack.
    if (e.status === 503)
      o.log.warn({ url: req.url, code: e.code, reason: e.message }, 'request refused');
    else if (e.status >= 500) o.log.error({ err, url: req.url }, 'request failed');
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
  registerOpenAiRoutes(app, {
    control: o.control,
    metrics: o.metrics,
    modelId: o.control.modelName,
    maxRoomsPerEngine: o.maxRoomsPerEngine ?? 512,
  });
  registerQueryRoutes(app, o.control);
  registerHealthRoutes(app, {
    control: o.control,
    canary: o.canary,
    heartbeatStaleMs: 2000,
    canaryStaleMs: 30_000,
  });
  registerAdminRoutes(app, o.control, o.adminToken);
  app.get(
    '/metrics',
    { schema: { tags: ['health'], summary: 'Prometheus metrics' } },
    async (_req, reply) =>
      reply.type('text/plain; version=0.0.4; charset=utf-8').send(await o.metrics.text()),
  );
  app.get('/docs', { schema: { hide: true } }, async () => app.swagger());
  return app;
}
