/**
 * `GET /v1/planner`: the planner's mode and targets, its last decision, and the decisions the
 * journal holds (`planner.decision`, newest first) — what `pdctl plan --url` prints, and what an
 * outside autoscaler reads besides `pdctl_planner_desired_engines`.
 */
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync, FastifyRequest } from 'fastify';
import type { JournalReader } from '../journal/store.ts';
import type { Planner } from '../planner/online.ts';
import { Errors } from './schemas.ts';

const Open = { additionalProperties: true } as const;
const Split = Type.Object({ prefill: Type.Integer(), decode: Type.Integer() });

export const PlannerBody = Type.Object({
  mode: Type.String(),
  intervalMs: Type.Integer(),
  config: Type.Object(
    {
      budget: Type.Integer(),
      sloTtftMs: Type.Number(),
      sloItlMs: Type.Number(),
      utilisation: Type.Number(),
      hold: Type.Integer(),
    },
    Open,
  ),
  last: Type.Union([
    Type.Object({ reason: Type.String(), fleet: Split, target: Split, proposal: Split }, Open),
    Type.Null(),
  ]),
  recent: Type.Array(
    Type.Object({ seq: Type.Integer(), ts: Type.Integer(), data: Type.Object({}, Open) }, Open),
  ),
});

/** Decisions `recent` lists at most. */
const RECENT = 20;

export const plannerRoutes: FastifyPluginAsync<{
  planner: Pick<Planner, 'status'>;
  journal: Pick<JournalReader, 'tail'>;
  /** Refuses who may not read it (access.ts: operators only, once an admin token is set). */
  access: (req: FastifyRequest) => void;
}> = async (app, { planner, journal, access }) => {
  app.get(
    '/v1/planner',
    {
      schema: {
        tags: ['queries'],
        summary: "The planner: mode, targets, last decision and the journal's recent decisions",
        response: { 200: PlannerBody, ...Errors },
      },
    },
    async (req) => {
      access(req);
      const recent = await journal.tail({
        type: 'planner.decision',
        limit: RECENT,
        order: 'newest',
      });
      return { ...planner.status(), recent: recent.reverse() };
    },
  );
};
