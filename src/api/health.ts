/**
 * Health that tells the truth (docs/design.md §8). `/health`: the process answers. `/health/ready`:
 * engines of both roles registered with fresh heartbeats, their bus loops consuming what they are
 * sent, the journal writable, and the last canary good. `/health/deep`: a canary room now, with a
 * deadline; 503 names the stage it stopped in. The wedge of docs/incident.md — a dead consumer behind
 * a live process — turns the last two red within seconds while `/health` stays green.
 */
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import type { ControlPlane } from '../control/control-plane.ts';
import type { Canary, CanaryResult } from '../control/evidence/canary.ts';
import type { RecoveryView } from '../recovery/view.ts';
import { ApiError } from './errors.ts';
import { CanaryBody, Errors, ReadyBody } from './schemas.ts';
import type { ShutdownGate } from './shutdown.ts';

export interface HealthDeps {
  control: ControlPlane;
  canary: Canary;
  /** The escalation ladder's view of each engine; null when no stack supervises them. */
  recovery: RecoveryView | null;
  /** A background canary older than this does not count. */
  canaryStaleMs: number;
  /**
   * False: no background canary runs (`--canary-interval-ms 0`), so readiness does not wait for
   * one; the engine, loop and journal checks decide, and a failed `/health/deep` still counts.
   */
  canaryBackground?: boolean;
  /** Set once the API shuts down: not ready from then on. */
  shutdown?: ShutdownGate;
}

export function readiness(
  deps: HealthDeps,
  now = Date.now(),
): { ready: boolean; checks: Record<string, { ok: boolean; detail: string }> } {
  const { control } = deps;
  const stalled = control.stalledEngines(undefined, now);
  const engines = control.engines(now, stalled);
  // Capacity is what routing uses (engine-view.ts `takesRooms`): a draining engine heartbeats
  // but takes no new rooms.
  const engineCheck = (role: 'prefill' | 'decode') => {
    const mine = engines.filter((e) => e.role === role);
    const n = mine.filter((e) => e.takesRooms).length;
    const draining = mine.filter((e) => e.status === 'draining').length;
    const cordoned = mine.filter((e) => e.cordon !== null).map((e) => e.engine);
    return {
      ok: n > 0,
      detail: `${n} taking rooms with a heartbeat in the last ${control.liveness.staleAfterMs} ms${draining > 0 ? `, ${draining} draining (pdctl engines undrain ENGINE)` : ''}${cordoned.length > 0 ? `, ${cordoned.length} cordoned (pdctl engines uncordon ${cordoned[0]})` : ''}`,
    };
  };
  // An engine the escalation ladder is working on is not ready, even once its symptom is gone:
  // it is ready again when the ladder has seen it serve (`engine.recovered`). A cordoned one is
  // out of service by design: named below, never a reason to pull the fleet out of rotation.
  const recovering = engines
    .map((s) => ({ engine: s.engine, view: deps.recovery?.ladder(s.engine) }))
    .filter((x) => x.view !== undefined && x.view.phase !== 'ok' && x.view.phase !== 'cordoned');
  const cordons = [...control.registry.cordons.all()];
  const ejections = [...control.registry.ejections.all()];
  const h = control.journalHealth();
  const bus = control.busStatus();
  const checks = {
    prefill_engines: engineCheck('prefill'),
    decode_engines: engineCheck('decode'),
    engine_loops: {
      ok: stalled.length === 0,
      detail:
        stalled.length === 0
          ? 'every engine consumes what it is sent, its transfers complete, its work loop moves'
          : stalled.map((s) => `${s.engine}: ${s.reason}`).join('; '),
    },
    recovery: {
      ok: recovering.length === 0,
      detail:
        recovering.length === 0
          ? 'no engine on the escalation ladder'
          : recovering
              .map((x) =>
                x.view?.phase === 'gave_up'
                  ? `${x.engine}: the ladder gave up, an operator is needed (${x.view.lastOutcome})`
                  : `${x.engine}: ${x.view?.phase} (${x.view?.reason})`,
              )
              .join('; '),
    },
    cordoned_engines: {
      ok: true,
      detail:
        cordons.length === 0
          ? 'no engine cordoned'
          : cordons
              .map(
                ([id, c]) =>
                  `${id} cordoned by the ${c.by} (${c.reason}): no rooms until \`pdctl engines uncordon ${id}\``,
              )
              .join('; '),
    },
    ejected_engines: {
      ok: true,
      detail:
        ejections.length === 0
          ? 'no engine ejected as an outlier'
          : ejections
              .map(
                ([id, e]) =>
                  `${id} ejected (${e.reason}): no rooms until a canary through it passes, tried from ${new Date(e.until).toISOString()}`,
              )
              .join('; '),
    },
    control_loop: {
      ok: bus.loop.running,
      detail: `bus receive loop ticks ${bus.loop.ticks}, restarts ${bus.loop.restarts}`,
    },
    journal: {
      ok: h.writable && h.state === 'ready',
      detail: h.writable ? `writable, ${h.commits} commits` : `not writable: ${h.lastError}`,
    },
    canary: canaryCheck(deps, now),
    ...(deps.shutdown?.closing
      ? {
          serving: {
            ok: false,
            detail: `shutting down for ${Math.round((now - (deps.shutdown.closingSince ?? now)) / 1000)} s: ${deps.shutdown.size} requests in flight finish, new ones get 503`,
          },
        }
      : {}),
  };
  return { ready: Object.values(checks).every((c) => c.ok), checks };
}

function canaryCheck(deps: HealthDeps, now: number): { ok: boolean; detail: string } {
  const last = deps.canary.last;
  const recentFailure = last !== null && !last.ok && now - last.at <= deps.canaryStaleMs;
  if (deps.canaryBackground === false && !recentFailure)
    return {
      ok: true,
      detail:
        'background canary off (--canary-interval-ms 0): readiness rests on the checks above; GET /health/deep runs one',
    };
  return {
    ok: last?.ok === true && now - last.at <= deps.canaryStaleMs,
    detail:
      last === null
        ? 'no canary has run yet'
        : last.ok
          ? `ok in ${last.ms} ms, ${Math.round((now - last.at) / 1000)} s ago`
          : `failing in ${last.stage}: ${last.reason}`,
  };
}

/** The shortest deadline a client may give `/health/deep`, in ms. */
export const DEEP_MIN_DEADLINE_MS = 250;
/** A new `/health/deep` canary starts at most this often; callers in between share one or wait. */
export const DEEP_MIN_INTERVAL_MS = 1000;

/** `/health`, `/health/ready`, `/health/deep`. */
export const healthRoutes: FastifyPluginAsync<HealthDeps> = async (app, deps) => {
  // One client canary at a time: callers while it runs share its answer; after it, the next
  // starts no sooner than DEEP_MIN_INTERVAL_MS after the last began.
  let probing: Promise<CanaryResult> | null = null;
  let probedAt = 0;
  app.get(
    '/health',
    {
      schema: {
        tags: ['health'],
        summary: 'The process is alive',
        response: { 200: Type.Object({ status: Type.Literal('ok') }) },
      },
    },
    async () => ({ status: 'ok' }),
  );

  app.get(
    '/health/ready',
    {
      schema: {
        tags: ['health'],
        summary: 'Ready to serve: engines, loops, journal and canary all good',
        description: '503 with the same body when any check fails; each check says why.',
        response: { 200: ReadyBody, 503: ReadyBody },
      },
    },
    async (_req, reply) => {
      const r = readiness(deps);
      return reply
        .code(r.ready ? 200 : 503)
        .send({ status: r.ready ? 'ready' : 'not_ready', checks: r.checks });
    },
  );

  app.get<{ Querystring: { deadline_ms?: string } }>(
    '/health/deep',
    {
      schema: {
        tags: ['health'],
        summary: `Runs a canary room through bootstrap, prefill, transfer and decode now (deadline_ms: ${DEEP_MIN_DEADLINE_MS} to 60000)`,
        description: `Its verdict is only returned: it never counts against an engine or changes readiness. One runs at a time (concurrent callers share it), and a new one starts at most every ${DEEP_MIN_INTERVAL_MS} ms: 429 with Retry-After otherwise.`,
        querystring: Type.Object(
          { deadline_ms: Type.Optional(Type.String({ maxLength: 20 })) },
          { additionalProperties: false },
        ),
        response: { 200: CanaryBody, 503: CanaryBody, '4xx': Errors['4xx'] },
      },
    },
    async (req, reply) => {
      const raw = req.query.deadline_ms;
      const deadlineMs = raw === undefined ? undefined : Number(raw);
      if (
        raw !== undefined &&
        (!/^\d+$/.test(raw) ||
          (deadlineMs as number) < DEEP_MIN_DEADLINE_MS ||
          (deadlineMs as number) > 60_000)
      )
        throw ApiError.of(
          'invalid_parameter',
          `deadline_ms must be an integer from ${DEEP_MIN_DEADLINE_MS} to 60000, got "${raw}"`,
          'deadline_ms',
        );
      if (!probing) {
        const wait = probedAt + DEEP_MIN_INTERVAL_MS - Date.now();
        if (wait > 0) {
          throw ApiError.of(
            'rate_limited',
            `a /health/deep canary ran less than ${DEEP_MIN_INTERVAL_MS} ms ago; retry in ${wait} ms (or read /health/ready, which the background canary keeps current)`,
          );
        }
        probedAt = Date.now();
        probing = deps.canary.probe(deadlineMs).finally(() => {
          probing = null;
        });
      }
      const r = await probing;
      return reply.code(r.ok ? 200 : 503).send({ status: r.ok ? 'ok' : 'failing', ...r });
    },
  );
};
