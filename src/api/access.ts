/**
 * Who reads the query routes. While no admin token is set they answer anyone, as they always have
 * (serve refuses to listen off loopback like that unless told --allow-open). With one set, the
 * token's holder reads everything, and a live tenant's key reads its own rooms: its room list,
 * its rooms' timelines and their events — never another tenant's, the engines or the fleet.
 */
import type { FastifyRequest } from 'fastify';
import type { TenantBook } from '../tenants/book.ts';
import { isToken } from './admin.ts';
import { ApiError } from './errors.ts';

export type Reader = { kind: 'operator' } | { kind: 'tenant'; tenant: string };

const OPERATOR: Reader = { kind: 'operator' };

/** The bearer credential a request carries (`Authorization: Bearer X`), or undefined. */
export function bearerOf(req: FastifyRequest): string | undefined {
  return /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? '')?.[1];
}

export function readerOf(req: FastifyRequest, token: string | null, book: TenantBook): Reader {
  if (token === null) return OPERATOR;
  const bearer = bearerOf(req);
  if (bearer !== undefined) {
    if (isToken(bearer, token)) return OPERATOR;
    const t = book.authenticate(bearer);
    if (t) return { kind: 'tenant', tenant: t.name };
  }
  throw ApiError.of(
    'unauthorized',
    "the query routes need Authorization: Bearer $PDCTL_ADMIN_TOKEN, or a tenant's key for its own rooms",
  );
}

/** Routes about the fleet (engines, rooms in flight, stats, the planner): operators only. */
export function operatorsOnly(r: Reader, route: string): void {
  if (r.kind === 'tenant')
    throw ApiError.of(
      'forbidden',
      `${route} is for operators (PDCTL_ADMIN_TOKEN); a tenant's key reads its own rooms: /v1/rooms, /v1/rooms/:room, /v1/journal?room=ID`,
    );
}
