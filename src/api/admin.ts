/**
 * Operator actions: abort a room, and the recovery commands that exist (abort or free a room on an
 * engine, reset an engine's transfer endpoint, drain, shut down). Behind a bearer token when one is
 * configured; without one, only clients on loopback may call them.
 */

import { timingSafeEqual } from 'node:crypto';
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync, FastifyRequest } from 'fastify';
import { COMMANDS, type CommandName } from '../bus/protocol.ts';
import type { ControlPlane } from '../control/control-plane.ts';
import type { JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { isRequestId, isValidId, roomIdOf } from '../room/ids.ts';
import type { RoomAbortReason } from '../room/reasons.ts';
import { isTerminal, type RoomState } from '../room/states.ts';
import { ApiError } from './errors.ts';
import { Errors } from './schemas.ts';

/**
 * Admin routes change state, so a web page the operator happens to have open must not be able to
 * call them: a browser sends cross-site "simple" POSTs (text/plain or form bodies) without asking
 * first, and always with an `Origin`. A request whose Origin is not this server's own, or whose
 * body is not JSON, is refused before anything else is read.
 */
function refuseCrossSite(req: FastifyRequest): void {
  const origin = req.headers.origin;
  if (origin !== undefined) {
    let host: string | null = null;
    try {
      host = new URL(origin).host;
    } catch {
      host = null;
    }
    if (host === null || host !== req.headers.host) {
      throw ApiError.of(
        'cross_origin',
        `admin routes refuse requests from another origin (Origin: ${origin.slice(0, 200)}); call them from curl or the pdctl CLI`,
      );
    }
  }
  const type = req.headers['content-type'];
  const hasBody =
    type !== undefined ||
    (req.headers['content-length'] !== undefined && req.headers['content-length'] !== '0') ||
    req.headers['transfer-encoding'] !== undefined;
  if (hasBody && !/^application\/json\s*(;|$)/i.test(type ?? '')) {
    throw ApiError.of(
      'unsupported_media_type',
      `admin routes take a JSON body (content-type: application/json) or none; got ${type === undefined ? 'a body with no content-type' : `content-type ${type.slice(0, 100)}`}`,
    );
  }
}

/**
 * Whether `authority` (`host[:port]`, as in a Host header or an Origin) is a loopback name of
 * this server: localhost, 127.x.x.x or [::1], at the port the request came in on.
 */
function namesThisServer(
  authority: string,
  scheme: string,
  localPort: number | undefined,
): boolean {
  if (!/^[A-Za-z0-9.\-[\]:]+$/.test(authority)) return false;
  let url: URL;
  try {
    url = new URL(`${scheme}//${authority}`);
  } catch {
    return false;
  }
  const name = url.hostname;
  const loopback =
    name === 'localhost' || name === '[::1]' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(name);
  const port = url.port === '' ? (scheme === 'https:' ? 443 : 80) : Number(url.port);
  // A request injected in process (fastify's inject(), in tests) has no socket port to match.
  return loopback && (localPort === undefined || port === localPort);
}

/**
 * Without a token, admin routes trust the caller's address: loopback only. A web page can still
 * reach loopback through DNS rebinding (its own name resolving to 127.0.0.1), and then sends its
 * own name as Host and Origin — so the Host (and the Origin, when there is one) must be a
 * loopback name of this server, never merely equal to each other.
 */
function refuseUnlessLoopback(req: FastifyRequest): void {
  const ip = req.socket.remoteAddress ?? '';
  if (ip !== '127.0.0.1' && ip !== '::1' && ip !== '::ffff:127.0.0.1') {
    throw ApiError.of(
      'forbidden',
      'admin routes answer only on loopback unless PDCTL_ADMIN_TOKEN is set',
    );
  }
  const port = req.socket.localPort;
  const host = req.headers.host ?? '';
  if (!namesThisServer(host, 'http:', port)) {
    throw ApiError.of(
      'foreign_host',
      `without PDCTL_ADMIN_TOKEN, admin routes answer only requests addressed to this server by a loopback name (Host: localhost:${port} or 127.0.0.1:${port}); got Host: ${host.slice(0, 200) || '(none)'}`,
    );
  }
  const origin = req.headers.origin;
  if (origin !== undefined) {
    const m = /^(https?:)\/\/([^/]+)$/.exec(origin);
    if (!m || !namesThisServer(m[2] as string, m[1] as string, port)) {
      throw ApiError.of(
        'cross_origin',
        `admin routes refuse requests from another origin (Origin: ${origin.slice(0, 200)}); call them from curl or the pdctl CLI`,
      );
    }
  }
}

/** The admin routes' gate: the bearer token, or loopback only without one; never cross-site. */
export function authorize(req: FastifyRequest, token: string | null): void {
  refuseCrossSite(req);
  if (token === null) {
    refuseUnlessLoopback(req);
    return;
  }
  const given = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1] ?? '';
  if (!isToken(given, token)) {
    throw ApiError.of(
      'unauthorized',
      'missing or wrong bearer token (Authorization: Bearer $PDCTL_ADMIN_TOKEN)',
    );
  }
}

/** Whether `given` is the admin token, compared in constant time. */
export function isToken(given: string, token: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(token);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** What an operator's action says when the operator said nothing (journal/reasons.ts). */
const OPERATOR: RoomAbortReason = 'operator';

/** The `reason` of an operator's optional JSON body (`operator` when absent), or a 400. */
function operatorReason(body: unknown): string {
  const reason = (body as { reason?: unknown } | null | undefined)?.reason ?? OPERATOR;
  if (typeof reason !== 'string' || reason.length === 0 || reason.length > 200)
    throw ApiError.of(
      'invalid_parameter',
      'reason must be a string of 1 to 200 characters',
      'reason',
    );
  return reason;
}

export interface AdminDeps {
  control: ControlPlane;
  /** Where an operator's action is said, with what it named and why. */
  log: Logger;
  /** Where operator commands are recorded (`recovery.action`). */
  journal: JournalStore;
  /** Bearer token for these routes; null: loopback only. */
  token: string | null;
}

/**
 * `POST /v1/rooms/:room/abort`, `POST /v1/admin/engines/:engine/commands`, and
 * `POST /v1/admin/engines/:engine/cordon|uncordon`.
 */
export const adminRoutes: FastifyPluginAsync<AdminDeps> = async (
  app,
  { control, journal, token, log },
) => {
  app.post<{ Params: { room: string }; Body: unknown }>(
    '/v1/rooms/:room/abort',
    {
      // Token first, then the body: an unauthenticated caller learns nothing about the input.
      onRequest: async (req) => authorize(req, token),
      schema: {
        tags: ['operations'],
        summary:
          'Abort a room, or every live room of a request (its x-request-id): appends room.abort_requested; each room ends aborted once both engines released it. An id that names neither is 404 and journals nothing. Optional body: {"reason": "..."}',
        security: [{ bearer: [] }],
        params: Type.Object({
          room: Type.String({
            description: 'a room id, the completion id that names it, or a request id',
          }),
        }),
        response: {
          202: Type.Object({
            room: Type.String({ description: 'the room aborted (of a request: its first)' }),
            seq: Type.Integer({ description: 'the seq of its room.abort_requested' }),
            status: Type.Union([Type.Literal('applied'), Type.Literal('duplicate')]),
            requestId: Type.Optional(Type.String({ description: 'when the id named a request' })),
            rooms: Type.Optional(
              Type.Array(
                Type.Object({
                  room: Type.String(),
                  seq: Type.Integer(),
                  status: Type.Union([Type.Literal('applied'), Type.Literal('duplicate')]),
                }),
                { description: 'when the id named a request: each live room of it aborted' },
              ),
            ),
          }),
          ...Errors,
        },
      },
    },
    async (req, reply) => {
      const id = roomIdOf(req.params.room);
      const reason = operatorReason(req.body);
      if (!isValidId(id) && !isRequestId(id))
        throw ApiError.of('invalid_parameter', `not a room or request id: "${id}"`, 'room');
      const named = isValidId(id) ? (await journal.timeline(id)).room : null;
      const rooms = named ? [named] : (await journal.rooms({ requestId: id, limit: 100 })).rooms;
      // Checked first: an abort of an id the journal does not know would journal a rejection
      // under it, and `pdctl room ID` would then show a room that never was.
      if (rooms.length === 0)
        throw ApiError.of(
          'room_not_found',
          `no room and no request ${id} in the journal (nothing was journaled)`,
          'room',
        );
      const live = rooms.filter((r) => !isTerminal(r.state));
      if (live.length === 0) throw roomsEnded(named ? null : id, rooms);
      const aborted: Array<{ room: string; seq: number; status: 'applied' | 'duplicate' }> = [];
      for (const r of live) {
        const res = await control.abort(r.room, reason, 'api');
        if (res.status !== 'rejected')
          aborted.push({ room: r.room, seq: res.seq, status: res.status });
        else if (named) throw roomsEnded(null, [{ room: r.room, state: res.state ?? r.state }]);
      }
      const [first] = aborted;
      if (!first) throw roomsEnded(id, rooms);
      // Its own line at 3 a.m.: which rooms an operator ended, of which request, and why.
      req.room = () => first.room;
      log.info(
        {
          room: first.room,
          ...(named ? {} : { requestId: id, rooms: aborted.map((a) => a.room) }),
          reason,
          client: req.ip,
        },
        'operator abort: room.abort_requested journaled',
      );
      return reply.code(202).send(named ? first : { ...first, requestId: id, rooms: aborted });
    },
  );

  app.post<{
    Params: { engine: string };
    Body: { command: CommandName; room?: string; reason?: string };
  }>(
    '/v1/admin/engines/:engine/commands',
    {
      onRequest: async (req) => authorize(req, token),
      schema: {
        tags: ['operations'],
        summary:
          'Send a recovery command to an engine: abort_room, free_room, reset_transfer, drain, undrain, shutdown',
        body: Type.Object(
          {
            command: Type.Union(COMMANDS.map((c) => Type.Literal(c))),
            room: Type.Optional(Type.String({ maxLength: 128 })),
            reason: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
          },
          { additionalProperties: false },
        ),
        security: [{ bearer: [] }],
        params: Type.Object({ engine: Type.String() }),
        response: {
          202: Type.Object({
            engine: Type.String(),
            command: Type.String(),
            room: Type.Union([Type.String(), Type.Null()]),
          }),
          ...Errors,
        },
      },
    },
    async (req, reply) => {
      const { command, room, reason } = req.body;
      if (
        (command === 'abort_room' || command === 'free_room') &&
        (room === undefined || !isValidId(room))
      ) {
        throw ApiError.of('invalid_parameter', `${command} needs a room id`, 'room');
      }
      const sent = control.command(req.params.engine, command, room ?? null, reason ?? 'operator');
      if (!sent)
        throw ApiError.of(
          'engine_not_found',
          `engine ${req.params.engine} is not connected`,
          'engine',
        );
      await journal.append({
        type: 'recovery.action',
        engine: req.params.engine,
        room: room ?? null,
        source: 'api',
        data: { action: command, reason: reason ?? 'operator', outcome: 'sent' },
      });
      return reply.code(202).send({ engine: req.params.engine, command, room: room ?? null });
    },
  );

  for (const action of ['cordon', 'uncordon'] as const) {
    app.post<{ Params: { engine: string }; Body: { reason?: unknown } | undefined }>(
      `/v1/admin/engines/:engine/${action}`,
      {
        onRequest: async (req) => authorize(req, token),
        schema: {
          tags: ['operations'],
          summary:
            action === 'cordon'
              ? 'Cordon an engine: no new rooms, whatever incarnation registers, until uncordoned; the rooms it has finish there and its process is left as it is, for inspection (journaled engine.cordoned). The ladder cordons an engine a restart did not cure, and also moves its rooms and fences it. Optional body: {"reason": "..."}'
              : 'Uncordon an engine: it takes new rooms again (journaled engine.uncordoned). Optional body: {"reason": "..."}',
          security: [{ bearer: [] }],
          params: Type.Object({ engine: Type.String() }),
          response: {
            202: Type.Object({ engine: Type.String(), command: Type.String() }),
            ...Errors,
          },
        },
      },
      async (req, reply) => {
        const { engine } = req.params;
        const reason = operatorReason(req.body);
        const cordons = control.registry.cordons;
        const deps = { journal, log: req.log, control };
        if (action === 'cordon') {
          const s = control.registry.get(engine);
          if (!s && !cordons.has(engine))
            throw ApiError.of('engine_not_found', `engine ${engine} is not registered`, 'engine');
          // Not fenced: an operator's cordon leaves the process and its rooms alone.
          if (!(await cordons.cordon(deps, engine, null, reason, 'operator')))
            throw ApiError.of('engine_cordoned', `engine ${engine} is already cordoned`, 'engine');
        } else if (!(await cordons.uncordon(deps, engine, reason)))
          throw ApiError.of('engine_not_cordoned', `engine ${engine} is not cordoned`, 'engine');
        return reply.code(202).send({ engine, command: action });
      },
    );
  }
};

/** 409: the room has ended (or, named by a request id, every room of it has); nothing to abort. */
function roomsEnded(
  requestId: string | null,
  rooms: ReadonlyArray<{ room: string; state: RoomState | string }>,
): ApiError {
  const message =
    requestId === null
      ? `room ${rooms[0]?.room} is already ${rooms[0]?.state}`
      : `request ${requestId}'s rooms have ended: ${rooms.map((r) => `${r.room} ${r.state}`).join(', ')}`;
  return ApiError.of('room_terminal', message, 'room');
}
