/**
 * `GET|POST /v1/tenants`, `POST /v1/tenants/:tenant/rotate|revoke`: who may call the serving
 * routes (src/tenants/). Admin routes: behind the admin token, or loopback without one. A key is
 * in the answer of the call that made it and nowhere else — not the journal, not a log line.
 */
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import type { ControlPlane } from '../control/control-plane.ts';
import { BANDS } from '../room/events.ts';
import { addTenant, revokeTenant, rotateKey } from '../tenants/admin.ts';
import { authorize } from './admin.ts';
import { Errors } from './schemas.ts';

export interface TenantRoutesDeps {
  control: ControlPlane;
  token: string | null;
}

const Issued = Type.Object({
  tenant: Type.String(),
  key: Type.String({ description: 'shown this once; the journal keeps only its SHA-256' }),
  keyId: Type.String({ description: "the first 8 hex digits of the key's SHA-256" }),
});

const TenantRow = Type.Object({
  name: Type.String(),
  band: Type.Union(BANDS.map((b) => Type.Literal(b))),
  maxConcurrency: Type.Union([Type.Integer(), Type.Null()]),
  tokensPerMinute: Type.Union([Type.Integer(), Type.Null()]),
  keyId: Type.String(),
  addedAt: Type.Integer(),
  rotatedAt: Type.Union([Type.Integer(), Type.Null()]),
  revokedAt: Type.Union([Type.Integer(), Type.Null()]),
});

const Name = Type.Object({ tenant: Type.String() });

export const tenantRoutes: FastifyPluginAsync<TenantRoutesDeps> = async (
  app,
  { control, token },
) => {
  const admin = {
    onRequest: async (req: Parameters<typeof authorize>[0]) => authorize(req, token),
  };
  const security = [{ bearer: [] }];
  app.get(
    '/v1/tenants',
    {
      ...admin,
      schema: {
        tags: ['tenants'],
        summary: 'Every tenant ever added (revoked ones too), with its band, limits and key id',
        security,
        response: { 200: Type.Object({ tenants: Type.Array(TenantRow) }), ...Errors },
      },
    },
    async () => ({ tenants: control.tenants.list() }),
  );
  app.post<{
    Body: {
      name: string;
      band?: 'interactive' | 'batch';
      maxConcurrency?: number;
      tokensPerMinute?: number;
    };
  }>(
    '/v1/tenants',
    {
      ...admin,
      schema: {
        tags: ['tenants'],
        summary:
          'Add a tenant (journals tenant.added with its key’s hash); the answer holds its key, shown this once',
        security,
        body: Type.Object(
          {
            name: Type.String(),
            band: Type.Optional(Type.Union(BANDS.map((b) => Type.Literal(b)))),
            maxConcurrency: Type.Optional(Type.Integer({ minimum: 1 })),
            tokensPerMinute: Type.Optional(Type.Integer({ minimum: 1 })),
          },
          { additionalProperties: false },
        ),
        response: { 201: Issued, ...Errors },
      },
    },
    async (req, reply) => {
      const issued = await addTenant(control.journal, control.tenants, req.body, 'operator');
      return reply.code(201).send(issued);
    },
  );
  app.post<{ Params: { tenant: string } }>(
    '/v1/tenants/:tenant/rotate',
    {
      ...admin,
      schema: {
        tags: ['tenants'],
        summary: 'A new key for the tenant; the old one is refused from now on',
        security,
        params: Name,
        response: { 200: Issued, ...Errors },
      },
    },
    async (req) => rotateKey(control.journal, control.tenants, req.params.tenant, 'operator'),
  );
  app.post<{ Params: { tenant: string }; Body: { reason?: string } | undefined }>(
    '/v1/tenants/:tenant/revoke',
    {
      ...admin,
      schema: {
        tags: ['tenants'],
        summary: 'End the tenant: its key is refused from now on, and its name is not given again',
        security,
        params: Name,
        body: Type.Optional(
          Type.Object(
            { reason: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })) },
            { additionalProperties: false },
          ),
        ),
        response: {
          200: Type.Object({ tenant: Type.String(), revoked: Type.Boolean() }),
          ...Errors,
        },
      },
    },
    async (req) => {
      const { tenant } = req.params;
      await revokeTenant(control.journal, control.tenants, tenant, 'operator', req.body?.reason);
      return { tenant, revoked: true };
    },
  );
};
