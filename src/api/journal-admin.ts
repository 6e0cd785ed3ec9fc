/**
 * `POST /v1/admin/journal/prune` and `GET /v1/admin/journal/prune`: retention by an operator on a
 * serving control plane, through the writer it already holds (journal/retention.ts) — what
 * `pdctl journal prune --url` calls. A pass runs in the background, a chunk per transaction; the
 * GET says how far it got and what the last one did.
 */
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import type { Retention } from '../journal/retention.ts';
import type { JournalStore } from '../journal/store.ts';
import { formatAge, parseDuration } from '../time.ts';
import { authorize } from './admin.ts';
import { ApiError } from './errors.ts';
import { Errors } from './schemas.ts';

export interface JournalAdminDeps {
  journal: JournalStore;
  retention: Retention;
  token: string | null;
  /** The shortest `olderThan` of a pass (a dry run counts with any). */
  floorMs: number;
}

const Duration = (description: string) => Type.String({ minLength: 1, maxLength: 40, description });

const PruneBody = Type.Object(
  {
    olderThan: Duration('terminal rooms that ended longer ago than this go, e.g. 7d, 12h'),
    eventsOlderThan: Type.Optional(
      Duration('events of no room older than this go too (at least olderThan); absent: kept'),
    ),
    chunk: Type.Optional(Type.Integer({ minimum: 1, maximum: 100_000 })),
    dryRun: Type.Optional(Type.Boolean()),
  },
  { additionalProperties: false },
);

const Result = Type.Object(
  {
    cutoffTs: Type.Integer(),
    eventsCutoffTs: Type.Union([Type.Integer(), Type.Null()]),
    rooms: Type.Integer(),
    events: Type.Integer(),
    otherEvents: Type.Integer(),
    batches: Type.Integer(),
  },
  { additionalProperties: true },
);

const Pass = Type.Object(
  {
    by: Type.String(),
    startedAt: Type.Integer(),
    ms: Type.Union([Type.Integer(), Type.Null()]),
    result: Result,
    error: Type.Union([Type.String(), Type.Null()]),
  },
  { additionalProperties: true },
);

const Status = Type.Object(
  {
    policy: Type.Union([Type.Object({}, { additionalProperties: true }), Type.Null()]),
    running: Type.Union([Pass, Type.Null()]),
    last: Type.Union([Pass, Type.Null()]),
    lastByOperator: Type.Union([Pass, Type.Null()]),
    totals: Type.Object({}, { additionalProperties: true }),
  },
  { additionalProperties: true },
);

function duration(field: string, text: string): number {
  try {
    const ms = parseDuration(text, field);
    if (ms > 0) return ms;
  } catch (err) {
    throw ApiError.of('invalid_duration', (err as Error).message, field);
  }
  throw ApiError.of('invalid_duration', `${field} must be longer than 0`, field);
}

export const journalAdminRoutes: FastifyPluginAsync<JournalAdminDeps> = async (
  app,
  { journal, retention, token, floorMs },
) => {
  app.post<{
    Body: { olderThan: string; eventsOlderThan?: string; chunk?: number; dryRun?: boolean };
  }>(
    '/v1/admin/journal/prune',
    {
      onRequest: async (req) => authorize(req, token),
      schema: {
        tags: ['operations'],
        summary:
          'Prune the journal now: whole terminal rooms that ended longer ago than olderThan (at least 5 minutes, as serve --retain; never a live room), and with eventsOlderThan events of no room. Starts a pass in the background (202) and journals journal.pruned; GET says how far it got. dryRun counts instead (200).',
        security: [{ bearer: [] }],
        body: PruneBody,
        response: {
          200: Type.Object(
            {
              dryRun: Type.Literal(true),
              cutoffTs: Type.Integer(),
              eventsCutoffTs: Type.Union([Type.Integer(), Type.Null()]),
              rooms: Type.Integer(),
              events: Type.Integer(),
              otherEvents: Type.Integer(),
            },
            { additionalProperties: false },
          ),
          202: Pass,
          ...Errors,
        },
      },
    },
    async (req, reply) => {
      const b = req.body;
      const roomsMs = duration('olderThan', b.olderThan);
      const eventsMs =
        b.eventsOlderThan === undefined ? null : duration('eventsOlderThan', b.eventsOlderThan);
      if (eventsMs !== null && eventsMs < roomsMs)
        throw ApiError.of(
          'invalid_duration',
          `eventsOlderThan (${b.eventsOlderThan}) must be at least olderThan (${b.olderThan}): events of no room are kept at least as long as rooms`,
          'eventsOlderThan',
        );
      if (b.dryRun === true) {
        const now = Date.now();
        const cutoffTs = now - roomsMs;
        const eventsCutoffTs = eventsMs === null ? null : now - eventsMs;
        const n = await journal.countPrunable(cutoffTs, eventsCutoffTs ?? undefined);
        return reply.code(200).send({ dryRun: true, cutoffTs, eventsCutoffTs, ...n });
      }
      if (roomsMs < floorMs)
        throw ApiError.of(
          'invalid_duration',
          `olderThan ${b.olderThan} is shorter than ${formatAge(floorMs)}: a room that ended may await its engines' releases that long, and pruning it first would lose them; pass ${formatAge(floorMs)} or more (dryRun counts with any)`,
          'olderThan',
        );
      const pass = retention.runNow({
        roomsMs,
        eventsMs,
        ...(b.chunk ? { chunkRooms: b.chunk } : {}),
      });
      if (pass === null) {
        const running = retention.status().running;
        throw ApiError.of(
          'prune_running',
          running
            ? `a prune is already running (${running.by}, started ${new Date(running.startedAt).toISOString()}, ${running.result.rooms} rooms so far); GET /v1/admin/journal/prune says when it ends`
            : 'the control plane is stopping: no prune now',
        );
      }
      return reply.code(202).send(pass);
    },
  );

  app.get(
    '/v1/admin/journal/prune',
    {
      onRequest: async (req) => authorize(req, token),
      schema: {
        tags: ['operations'],
        summary:
          'Retention on this control plane: its policy (serve --retain), the pass running now and how far it got, the last pass, totals since start',
        security: [{ bearer: [] }],
        response: { 200: Status, ...Errors },
      },
    },
    async () => retention.status(),
  );
};
