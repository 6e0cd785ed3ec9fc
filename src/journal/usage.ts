/**
 * What each tenant used, from the journal alone: requests answered, refused and failed, prompt and
 * completion tokens, time waited in flow control's queue. The same answer for `pdctl usage`
 * (a journal file, an archive) and `GET /v1/usage` (the journal the server writes), whatever the
 * backend, because it reads only the reader's room listing and events.
 *
 * Counted by when it happened: a request by the end of the room that answered it, a refusal and a
 * wait by their event's time. The tokens are those its client was told in `usage`: the prompt of
 * its first room, and every token streamed to it — a request that migrated was streamed the
 * tokens its old room had (`room.migrated.tokens`) and then those of the room that completed it.
 */

import type { Room } from '../room/reducer.ts';
import { eventPages, type JournalReader, type RoomFilter } from './store.ts';

export interface TenantUsage {
  /** The tenant; null for requests that came with no key (an open API). */
  tenant: string | null;
  /** Requests answered: a room of theirs completed. */
  requests: number;
  /** Requests refused before any room (429 or 503): a limit, the queue, no engines, shutdown. */
  refused: number;
  /** Requests that had a room but no answer: it failed or was aborted, or their client left. */
  failed: number;
  promptTokens: number;
  completionTokens: number;
  /** Time waited in flow control's queue by the requests it took, in ms. */
  waitedMs: number;
}

export interface UsageWindow {
  since: number;
  until: number;
  /** Only this tenant. */
  tenant?: string;
}

/** The window `pdctl usage` and `/v1/usage` read when given no `since`: the last 24 hours. */
export const DEFAULT_USAGE_WINDOW_MS = 24 * 3600_000;

type Reader = Pick<JournalReader, 'rooms' | 'tail'>;

/** Rooms a page: the listing's maximum. */
const PAGE = 10_000;

/** Per tenant (null: no key), ordered by name with the open API's requests last. */
export async function usageOf(reader: Reader, w: UsageWindow): Promise<TenantUsage[]> {
  const byTenant = new Map<string | null, TenantUsage>();
  const of = (tenant: string | null): TenantUsage => {
    let u = byTenant.get(tenant);
    if (!u) {
      u = {
        tenant,
        requests: 0,
        refused: 0,
        failed: 0,
        promptTokens: 0,
        completionTokens: 0,
        waitedMs: 0,
      };
      byTenant.set(tenant, u);
    }
    return u;
  };
  const within = (t: number) => t >= w.since && t <= w.until;
  const wanted = (tenant: string | null | undefined) =>
    w.tenant === undefined || (tenant ?? null) === w.tenant;

  /** A request answered: its prompt and the tokens its client was told of. */
  const answered = (tenant: string | null, tokens: { prompt: number; completion: number }) => {
    const u = of(tenant);
    u.requests++;
    u.promptTokens += tokens.prompt;
    u.completionTokens += tokens.completion;
  };

  for (const [request, rooms] of await endedRequests(reader, w)) {
    const done = rooms.find((r) => r.state === 'completed');
    if (done) {
      answered(done.tenant, await tokensOf(reader, request, done));
      continue;
    }
    // Not answered here: ended here only if no room of its chain came after (a retry or a
    // migration's continuation is counted when it ends).
    const chain = await chainOf(reader, request);
    const last = latestOf(chain);
    if (!rooms.some((r) => r.room === last.room)) continue;
    if (last.state !== 'migrated') {
      // Failed after its client had every token it asked for (the first, from its prefill
      // engine): answered all the same.
      const whole = await answeredAt(reader, chain, last);
      if (whole) answered(last.tenant, whole);
      else of(last.tenant).failed++;
      continue;
    }
    // Migrated with nothing left to generate: its client was answered there, with no new room.
    const whole = await migratedWhole(reader, chain, last);
    if (whole) answered(last.tenant, whole);
  }

  for await (const page of eventPages(reader, { type: 'request.refused', since: w.since }))
    for (const ev of page)
      if (within(ev.ts) && wanted(ev.data.tenant))
        of(ev.data.tenant ?? null).refused += ev.data.count;
  for await (const page of eventPages(reader, { type: 'request.waited', since: w.since }))
    for (const ev of page)
      if (within(ev.ts) && wanted(ev.data.tenant))
        of(ev.data.tenant ?? null).waitedMs += ev.data.waitedMs;

  // A tenant asked for is answered, with zeros when it used nothing.
  if (w.tenant !== undefined) of(w.tenant);
  return [...byTenant.values()].sort((a, b) =>
    a.tenant === b.tenant
      ? 0
      : a.tenant === null
        ? 1
        : b.tenant === null
          ? -1
          : a.tenant < b.tenant
            ? -1
            : 1,
  );
}

/**
 * The requests with a room that ended in the window, each with those rooms (a request is a chain
 * of rooms when it migrated or was retried; the health canary's rooms serve no request).
 */
async function endedRequests(reader: Reader, w: UsageWindow): Promise<Map<string, Room[]>> {
  const byRequest = new Map<string, Room[]>();
  const filter: RoomFilter = {
    state: ['completed', 'failed', 'aborted', 'migrated'],
    since: w.since,
    until: w.until,
    excludeOrigin: ['canary'],
    limit: PAGE,
    ...(w.tenant === undefined ? {} : { tenant: w.tenant }),
  };
  for (;;) {
    const page = await reader.rooms(filter);
    for (const r of page.rooms) {
      if (r.requestId === null || r.terminalAt === null) continue;
      if (r.terminalAt < w.since || r.terminalAt > w.until) continue;
      const rooms = byRequest.get(r.requestId);
      if (rooms) rooms.push(r);
      else byRequest.set(r.requestId, [r]);
    }
    if (!page.nextCursor) break;
    filter.cursor = page.nextCursor;
  }
  return byRequest;
}

/** Every room of one request, whenever it ended. */
async function chainOf(reader: Reader, requestId: string): Promise<Room[]> {
  return (await reader.rooms({ requestId, limit: 100, excludeOrigin: ['canary'] })).rooms;
}

/**
 * Tokens streamed to the client before `room` took over: those of a migration
 * (`room.migrated.tokens`), or of a retry that continued after the first token its failed room's
 * prefill engine had streamed (the `tokens` of that room's `recovery.action retry_room`); else 0.
 */
async function streamedBefore(
  reader: Reader,
  room: Room,
  chain: () => Promise<Room[]>,
): Promise<number> {
  if (room.migratedFrom !== null) {
    const [moved] = await reader.tail({ type: 'room.migrated', room: room.migratedFrom, limit: 1 });
    return moved?.data.tokens ?? 0;
  }
  if (room.origin !== 'retry') return 0;
  for (const r of await chain()) {
    if (r.state !== 'failed') continue;
    const retry = await recoveryOf(reader, r.room, 'retry_room');
    if (retry?.data.toRoom === room.room) return retry.data.tokens ?? 0;
  }
  return 0;
}

/** The room's last `recovery.action` of `action`, if any. */
async function recoveryOf(reader: Reader, room: string, action: string) {
  const actions = await reader.tail({ type: 'recovery.action', room, limit: 20 });
  return actions.filter((e) => e.data.action === action).at(-1);
}

/** The prompt its client was told of (its first room's) and the tokens it was streamed. */
async function tokensOf(
  reader: Reader,
  requestId: string,
  done: Room,
): Promise<{ prompt: number; completion: number }> {
  let rooms: Room[] | null = null;
  const chain = async () => {
    rooms ??= await chainOf(reader, requestId);
    return rooms;
  };
  const before = await streamedBefore(reader, done, chain);
  const continues = done.migratedFrom !== null || done.origin === 'retry';
  const first = continues ? firstOf(await chain()) : done;
  return { prompt: first.promptTokens ?? 0, completion: before + (done.tokens ?? 0) };
}

/**
 * A request whose last room failed after its client had every token it asked for — the first,
 * streamed by its prefill engine (`recovery.action answer_complete`): answered. Null otherwise.
 */
async function answeredAt(
  reader: Reader,
  chain: Room[],
  last: Room,
): Promise<{ prompt: number; completion: number } | null> {
  if (last.state !== 'failed') return null;
  const answered = await recoveryOf(reader, last.room, 'answer_complete');
  if (!answered) return null;
  return { prompt: firstOf(chain).promptTokens ?? 0, completion: answered.data.tokens ?? 0 };
}

/**
 * A request whose last room migrated when every token it asked for had been streamed: the
 * control plane answered it there (finish `length`) and made no new room. Null for any other.
 */
async function migratedWhole(
  reader: Reader,
  chain: Room[],
  last: Room,
): Promise<{ prompt: number; completion: number } | null> {
  const [moved] = await reader.tail({ type: 'room.migrated', room: last.room, limit: 1 });
  if (!moved || chain.some((r) => r.room === moved.data.toRoom)) return null;
  const first = firstOf(chain);
  const streamed = moved.data.tokens ?? 0;
  if (first.maxTokens === null || streamed < first.maxTokens) return null;
  return { prompt: first.promptTokens ?? 0, completion: streamed };
}

function firstOf(rooms: Room[]): Room {
  return rooms.reduce((a, b) => (b.createdAt < a.createdAt ? b : a));
}

function latestOf(rooms: Room[]): Room {
  return rooms.reduce((a, b) => (b.createdAt > a.createdAt ? b : a));
}
