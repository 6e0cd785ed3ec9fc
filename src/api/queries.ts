/**
 * Incident queries over HTTP, the same as the CLI's: rooms by filter, one room's timeline, the
 * journal as NDJSON (optionally followed live), the rooms in flight now, engines as the control
 * plane sees them, stats, and what each tenant used.
 */

import type { ServerResponse } from 'node:http';
import { Type } from '@sinclair/typebox';
import type { FastifyPluginAsync } from 'fastify';
import type { ControlPlane } from '../control/control-plane.ts';
import type { UsageError } from '../errors.ts';
import { type NamedFilter, unknownName } from '../journal/filter-names.ts';
import { tailMatcher } from '../journal/queries.ts';
import { describeRefusal } from '../journal/refusal-text.ts';
import type { Retention } from '../journal/retention.ts';
import {
  type JournalStore,
  originFilter,
  type RoomFilter,
  type TailFilter,
} from '../journal/store.ts';
import { DEFAULT_USAGE_WINDOW_MS, usageOf } from '../journal/usage.ts';
import type { RecoveryView } from '../recovery/view.ts';
import { EVENT_TYPES, type EventType, type JournalEvent } from '../room/events.ts';
import { isValidId, roomIdOf } from '../room/ids.ts';
import type { Room } from '../room/reducer.ts';
import { isRoomState, LIVE_STATES, ROOM_STATES, type RoomState } from '../room/states.ts';
import { parseTime } from '../time.ts';
import { hostTag } from '../transfer/host.ts';
import { operatorsOnly, type Reader, readerOf } from './access.ts';
import { ApiError, roomNotFound } from './errors.ts';
import type { ApiMetrics } from './metrics.ts';
import {
  EnginesBody,
  Errors,
  LiveBody,
  RoomPageBody,
  StatsBody,
  TimelineBody,
  UsageBody,
} from './schemas.ts';

const Str = Type.Optional(Type.String({ maxLength: 500 }));

function time(name: string, v: string | undefined, now: number): number | undefined {
  if (v === undefined) return undefined;
  try {
    return parseTime(v, now);
  } catch (err) {
    throw ApiError.of('invalid_time', `${name}: ${(err as UsageError).message}`, name);
  }
}

function int(name: string, v: string | undefined, min: number, max: number): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!/^\d+$/.test(v) || n < min || n > max) {
    throw ApiError.of(
      'invalid_parameter',
      `${name} must be an integer from ${min} to ${max}, got "${v}"`,
      name,
    );
  }
  return n;
}

function id(name: string, v: string | undefined): string | undefined {
  if (v !== undefined && !isValidId(v))
    throw ApiError.of('invalid_parameter', `${name} is not a valid id: "${v}"`, name);
  return v;
}

export interface QueryDeps {
  control: ControlPlane;
  /** What the queries read: the journal the control plane writes. */
  journal: JournalStore;
  /** The escalation ladder's view of each engine; null when no stack supervises them. */
  recovery: RecoveryView | null;
  /** Running counts (KV transfers per engine and transport); absent: not shown. */
  metrics?: ApiMetrics;
  /** With an admin token, its holder reads everything and a tenant's key its own rooms (access.ts). */
  adminToken: string | null;
  /** The journal's retention while serving: its policy and passes, in `/v1/stats`. */
  retention?: Retention;
}

/** `/v1/rooms`, `/v1/rooms/:room`, `/v1/journal`, `/v1/live`, `/v1/engines`, `/v1/stats`, `/v1/usage`. */
export const queryRoutes: FastifyPluginAsync<QueryDeps> = async (
  app,
  { control, journal, recovery, metrics, adminToken, retention },
) => {
  // Before anything is read: who asks, and what of the journal that lets them see.
  const readers = new WeakMap<object, Reader>();
  app.addHook('onRequest', async (req) => {
    readers.set(req, readerOf(req, adminToken, control.tenants));
  });
  const readerFor = (req: object): Reader => readers.get(req) ?? { kind: 'operator' };
  /** A filter that matched nothing because it names what the journal does not hold: 400. */
  const knownNames = async (filter: NamedFilter) => {
    const unknown = await unknownName(journal, filter);
    if (unknown) throw ApiError.of('invalid_parameter', unknown.message, unknown.param);
  };
  /** A tenant's own room, or 404 as for a room that does not exist: others' are not told of. */
  const ownRoom = async (r: Reader, room: string) => {
    if (r.kind === 'tenant' && (await journal.timeline(room)).room?.tenant !== r.tenant)
      throw roomNotFound(room);
  };
  app.get<{ Querystring: Record<string, string | undefined> }>(
    '/v1/rooms',
    {
      schema: {
        tags: ['queries'],
        summary:
          'Rooms by state, engine, reason, request id, tenant, origin, time window or "in flight at T", newest first (canary rooms only with origin=canary or all)',
        querystring: Type.Object(
          {
            state: Str,
            engine: Str,
            reason: Str,
            request_id: Str,
            tenant: Str,
            since: Str,
            until: Str,
            in_flight_at: Str,
            origin: Str,
            limit: Str,
            cursor: Str,
          },
          { additionalProperties: false },
        ),
        response: { 200: RoomPageBody, ...Errors },
      },
    },
    async (req) => {
      const q = req.query;
      const now = Date.now();
      const filter: RoomFilter = { limit: int('limit', q.limit, 1, 10_000) ?? 100 };
      if (q.state !== undefined) {
        const states = q.state.split(',');
        const bad = states.find((s) => !isRoomState(s));
        if (bad !== undefined)
          throw ApiError.of(
            'invalid_parameter',
            `unknown state "${bad}"; states are: ${ROOM_STATES.join(', ')}`,
            'state',
          );
        filter.state = states as RoomState[];
      }
      filter.engine = id('engine', q.engine);
      if (q.reason !== undefined) filter.reason = q.reason;
      if (q.request_id !== undefined) filter.requestId = q.request_id;
      if (q.tenant !== undefined) filter.tenant = q.tenant;
      const reader = readerFor(req);
      if (reader.kind === 'tenant') filter.tenant = reader.tenant;
      filter.since = time('since', q.since, now);
      filter.until = time('until', q.until, now);
      filter.inFlightAt = time('in_flight_at', q.in_flight_at, now);
      try {
        Object.assign(filter, originFilter(q.origin));
      } catch (err) {
        throw ApiError.of('invalid_parameter', (err as Error).message, 'origin');
      }
      if (q.cursor !== undefined) filter.cursor = q.cursor;
      const page = await journal.rooms(filter);
      // A tenant is not told the fleet's engine names: its empty page is its answer.
      if (page.rooms.length === 0 && filter.cursor === undefined && reader.kind !== 'tenant')
        await knownNames(filter);
      if (filter.requestId === undefined || page.rooms.length > 0)
        return { rooms: page.rooms, nextCursor: page.nextCursor };
      // A request refused before it had a room is on the record only as a refusal.
      const refusals = await journal.tail({
        type: 'request.refused',
        requestId: filter.requestId,
        limit: 20,
      });
      // With their text as pdctl room prints it: the page shows that, never a wording of its own.
      return {
        rooms: page.rooms,
        nextCursor: page.nextCursor,
        refusals,
        ...(refusals.length > 0 ? { refusalText: refusals.map(describeRefusal) } : {}),
      };
    },
  );

  app.get<{ Params: { room: string } }>(
    '/v1/rooms/:room',
    {
      schema: {
        tags: ['queries'],
        summary: 'One room: its projection, every event, and the time spent in each state',
        params: Type.Object({
          room: Type.String({
            description: 'room id, e.g. r-mf3k2a9x-0001c4, or the completion id that names it',
          }),
        }),
        response: { 200: TimelineBody, ...Errors },
      },
    },
    async (req) => {
      const room = id('room', roomIdOf(req.params.room)) as string;
      const t = await journal.timeline(room);
      if (!t.room && t.events.length === 0) throw roomNotFound(room);
      const reader = readerFor(req);
      if (reader.kind === 'tenant' && t.room?.tenant !== reader.tenant) throw roomNotFound(room);
      return t;
    },
  );

  // Followed journals never end by themselves: closing the server ends them first, so that a
  // graceful shutdown does not wait out its drain for a watcher.
  const follows = new Set<ServerResponse>();
  app.addHook('preClose', async () => {
    for (const raw of follows) raw.end();
  });

  app.get<{ Querystring: Record<string, string | undefined> }>(
    '/v1/journal',
    {
      schema: {
        tags: ['queries'],
        summary:
          'Journal events as NDJSON, oldest first; follow=1 keeps the response open and streams new ones',
        querystring: Type.Object(
          {
            after_seq: Str,
            type: Str,
            room: Str,
            engine: Str,
            since: Str,
            request_id: Str,
            limit: Str,
            follow: Str,
          },
          { additionalProperties: false },
        ),
        response: {
          200: {
            description: 'One JSON event per line (see the Event schema)',
            content: { 'application/x-ndjson': { schema: Type.String() } },
          },
          ...Errors,
        },
      },
    },
    async (req, reply) => {
      const q = req.query;
      const types = q.type?.split(',');
      const badType = types?.find((t) => !(EVENT_TYPES as string[]).includes(t));
      if (badType !== undefined)
        throw ApiError.of('invalid_parameter', `unknown event type "${badType}"`, 'type');
      const filter: TailFilter = {
        afterSeq: int('after_seq', q.after_seq, 0, Number.MAX_SAFE_INTEGER),
        type: types as EventType[] | undefined,
        room: id('room', q.room),
        engine: id('engine', q.engine),
        since: time('since', q.since, Date.now()),
        requestId: q.request_id,
        limit: int('limit', q.limit, 1, 10_000) ?? 1000,
        order: q.after_seq !== undefined || q.since !== undefined ? 'oldest' : 'newest',
      };
      const follow = q.follow === '1' || q.follow === 'true';
      const reader = readerFor(req);
      if (reader.kind === 'tenant') {
        if (filter.room === undefined)
          throw ApiError.of(
            'forbidden',
            "a tenant's key reads the journal of one of its own rooms: pass room=ID",
            'room',
          );
        await ownRoom(reader, filter.room);
      }
      const first = await journal.tail(filter);
      // Following waits for what is not here yet: an engine that has not joined may.
      if (
        first.length === 0 &&
        !follow &&
        filter.afterSeq === undefined &&
        reader.kind !== 'tenant'
      )
        await knownNames({ engine: filter.engine });
      reply.hijack();
      const raw = reply.raw;
      raw.writeHead(200, {
        'content-type': 'application/x-ndjson; charset=utf-8',
        'cache-control': 'no-cache',
      });
      for (const ev of first) raw.write(`${JSON.stringify(ev)}\n`);
      if (!follow) {
        raw.end();
        return reply;
      }
      const matches = tailMatcher(filter);
      const from =
        first.length > 0
          ? (first[first.length - 1] as JournalEvent).seq
          : Math.max(filter.afterSeq ?? 0, await journal.headSeq());
      const sub = journal.subscribe(from, (ev) => {
        if (matches(ev)) raw.write(`${JSON.stringify(ev)}\n`);
      });
      // A comment line every 15 s keeps proxies from closing an idle follow.
      const keepAlive = setInterval(() => raw.write('\n'), 15_000);
      follows.add(raw);
      raw.on('close', () => {
        follows.delete(raw);
        sub.close();
        clearInterval(keepAlive);
      });
      return reply;
    },
  );

  app.get<{ Querystring: Record<string, string | undefined> }>(
    '/v1/live',
    {
      schema: {
        tags: ['queries'],
        summary:
          'Rooms in flight now, from the control plane (no journal read): how many in each live state, and those longest in their state first',
        querystring: Type.Object({ limit: Str }, { additionalProperties: false }),
        response: { 200: LiveBody, ...Errors },
      },
    },
    async (req) => {
      operatorsOnly(readerFor(req), '/v1/live');
      const limit = int('limit', req.query.limit, 0, 10_000) ?? 200;
      const counts = Object.fromEntries(LIVE_STATES.map((s) => [s, 0])) as Record<string, number>;
      const live: Room[] = [];
      for (const room of control.liveRooms()) {
        if (!(room.state in counts)) continue;
        counts[room.state] = (counts[room.state] ?? 0) + 1;
        live.push(room);
      }
      live.sort((a, b) => a.stateSince - b.stateSince);
      return { counts, total: live.length, rooms: live.slice(0, limit) };
    },
  );

  app.get(
    '/v1/engines',
    {
      schema: {
        tags: ['queries'],
        summary: 'Engines as the control plane sees them now',
        response: { 200: EnginesBody, ...Errors },
      },
    },
    async (req) => {
      operatorsOnly(readerFor(req), '/v1/engines');
      const now = Date.now();
      return {
        engines: control.engines().map((s) => ({
          id: s.engine,
          role: s.role,
          status: s.status,
          state: s.status === 'connecting' ? 'connecting' : (s.heartbeat?.state ?? 'starting'),
          pid: s.pid,
          incarnation: s.incarnation,
          connectedAt: s.connectedAt,
          heartbeatAgeMs: now - s.lastSeen,
          heartbeats: s.beats,
          loopTicks: s.heartbeat?.ticks ?? {},
          queues: s.heartbeat?.queues ?? {},
          freePages: s.heartbeat?.freePages ?? null,
          totalPages: s.pages,
          pageBytes: s.pageBytes,
          roomsHeld: s.heartbeat?.rooms ?? null,
          liveRooms: s.liveRooms,
          pool: s.pool,
          kvDevice: s.kvDevice,
          host: s.host,
          hostTag: s.host === null ? null : hostTag(s.host),
          kvUcx: s.kvRemote !== null,
          kvSend: s.kvSend,
          runtime: s.runtime,
          transfers: metrics?.transfersOf(s.engine) ?? {},
          faultInjection: s.faultInjection,
          recovery: recovery?.ladder(s.engine) ?? null,
          restarts: recovery?.restarts(s.engine) ?? null,
          cordon: s.cordon,
          ejection: s.ejection,
        })),
      };
    },
  );

  app.get<{ Querystring: Record<string, string | undefined> }>(
    '/v1/usage',
    {
      schema: {
        tags: ['queries'],
        summary:
          "Per tenant, from the journal: requests answered, refused and failed, prompt and completion tokens, time waited (a tenant's key: its own)",
        querystring: Type.Object(
          { since: Str, until: Str, tenant: Str },
          { additionalProperties: false },
        ),
        response: { 200: UsageBody, ...Errors },
      },
    },
    async (req) => {
      const q = req.query;
      const now = Date.now();
      const reader = readerFor(req);
      const tenant = reader.kind === 'tenant' ? reader.tenant : q.tenant;
      const since = time('since', q.since, now) ?? now - DEFAULT_USAGE_WINDOW_MS;
      const until = time('until', q.until, now) ?? now;
      if (until < since) throw ApiError.of('invalid_parameter', 'until is before since', 'until');
      const tenants = await usageOf(journal, {
        since,
        until,
        ...(tenant === undefined ? {} : { tenant }),
      });
      return { since, until, tenants };
    },
  );

  app.get(
    '/v1/stats',
    {
      schema: {
        tags: ['queries'],
        summary: 'Journal statistics and control-plane counters',
        response: { 200: StatsBody, ...Errors },
      },
    },
    async (req) => {
      operatorsOnly(readerFor(req), '/v1/stats');
      const bus = control.busStatus();
      return {
        journal: await journal.stats(),
        health: journal.health(),
        control: control.counters,
        // Null: this control plane holds no retention (a standby, or a journal read only).
        retention: retention?.status() ?? null,
        bus: {
          endpoint: bus.endpoint,
          dropped: bus.dropped,
          loop: bus.loop,
          outbox: bus.outbox,
        },
      };
    },
  );
};
