/**
 * Talking to a running `pdctl serve` from the command line (`--url`, env PDCTL_URL): one helper
 * for the URL, the admin token (env PDCTL_ADMIN_TOKEN), and errors that say what to do.
 */
import type { Command } from 'commander';
import { UsageError } from '../errors.ts';
import type {
  JournalReader,
  RoomFilter,
  RoomPage,
  TailFilter,
  Timeline,
} from '../journal/store.ts';
import type { EventType, JournalEventOf } from '../room/events.ts';
import { EXIT, note } from './context.ts';

export const DEFAULT_URL = process.env.PDCTL_URL ?? 'http://127.0.0.1:8080';

/** `--url` of the commands that read either a journal file or a server. */
export const READ_URL_HELP =
  'read a running pdctl serve (its query routes) instead of --journal (env PDCTL_URL)';

/**
 * Where a read-only command (`rooms`, `room`, `journal tail`) reads: `--url` or `--journal` when
 * given, else a server named by env PDCTL_URL, else the journal file (env PDCTL_JOURNAL or the
 * default). Both variables set, and neither flag: a usage error rather than a guess.
 */
export function readTarget(
  opts: { url?: string; journal: string; archive?: string },
  cmd: Command,
): { url: string } | { journal: string } {
  if (opts.archive !== undefined) {
    if (opts.url !== undefined)
      throw new UsageError('--archive reads files here, --url a server: pass one of them');
    return { journal: opts.journal };
  }
  if (opts.url !== undefined) return { url: opts.url };
  if (cmd.getOptionValueSource('journal') === 'cli') return { journal: opts.journal };
  const url = process.env.PDCTL_URL;
  if (url === undefined || url === '') return { journal: opts.journal };
  if (process.env.PDCTL_JOURNAL)
    throw new UsageError(
      'both PDCTL_URL and PDCTL_JOURNAL are set: pass --url or --journal to say which to read',
    );
  return { url };
}

/** The server could not be reached, or answered with something that is not JSON. */
export class UnreachableError extends Error {
  override name = 'UnreachableError';
}

/**
 * Runs a command against a server: one that cannot be reached is exit 4, with what to do, after
 * `pdctl` (and the command's name, when given).
 */
export async function reaching(name: string | null, fn: () => Promise<number>): Promise<number> {
  try {
    return await fn();
  } catch (err) {
    if (!(err instanceof UnreachableError)) throw err;
    note(`pdctl${name ? ` ${name}` : ''}: ${err.message}`);
    return EXIT.unreachable;
  }
}

export interface ServerAnswer<T> {
  status: number;
  body: T;
}

function urlOf(base: string, path: string): URL {
  try {
    return new URL(path, base);
  } catch {
    throw new UsageError(`--url must be an http(s) URL like http://127.0.0.1:8080, got "${base}"`);
  }
}

/** fetch, with the admin token (env PDCTL_ADMIN_TOKEN) and an UnreachableError when it fails. */
async function request(url: URL, init: RequestInit): Promise<Response> {
  const token = process.env.PDCTL_ADMIN_TOKEN;
  try {
    return await fetch(url, {
      ...init,
      headers: {
        ...(init.headers as Record<string, string> | undefined),
        ...(token ? { authorization: `Bearer ${token}` } : {}),
      },
    });
  } catch (err) {
    const e = err as Error & { cause?: { code?: string; message?: string } };
    // Stopped by the caller (Ctrl-C), not a timeout: not the server's fault.
    if ((init.signal?.reason as { name?: string } | undefined)?.name === 'AbortError') throw err;
    const cause = e.cause?.code ?? e.cause?.message;
    throw new UnreachableError(
      `cannot reach ${url}: ${cause ? `${e.message} (${cause})` : e.message}. Is pdctl serve running there? Pass --url.`,
    );
  }
}

/** `path` at the server `base`, as JSON. Throws UsageError for a bad URL, UnreachableError if down. */
export async function callServer<T>(
  base: string,
  path: string,
  init: { method?: 'GET' | 'POST'; body?: unknown } = {},
): Promise<ServerAnswer<T>> {
  const url = urlOf(base, path);
  const res = await request(url, {
    method: init.method ?? 'GET',
    headers: init.body === undefined ? {} : { 'content-type': 'application/json' },
    ...(init.body === undefined ? {} : { body: JSON.stringify(init.body) }),
    signal: AbortSignal.timeout(5000),
  });
  const text = await res.text();
  try {
    return { status: res.status, body: JSON.parse(text) as T };
  } catch {
    throw new UnreachableError(
      `${url} answered ${res.status} with something that is not JSON: ${text.slice(0, 200)}`,
    );
  }
}

/**
 * The lines of a streaming (NDJSON) answer of `path`, as they arrive; ends when the server ends
 * it or `signal` aborts. An answer other than 200 is a UsageError with the server's message.
 */
export async function* streamLines(
  base: string,
  path: string,
  signal: AbortSignal,
): AsyncGenerator<string> {
  const url = urlOf(base, path);
  const res = await request(url, { signal });
  if (res.status !== 200) {
    const text = await res.text();
    let body: unknown = {};
    try {
      body = JSON.parse(text);
    } catch {}
    throw new UsageError(errorOf(res.status, body));
  }
  if (!res.body) return;
  const decoder = new TextDecoder();
  let buffer = '';
  try {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      buffer += decoder.decode(chunk, { stream: true });
      const lines = buffer.split('\n');
      buffer = lines.pop() ?? '';
      for (const line of lines) if (line.trim() !== '') yield line;
    }
  } catch (err) {
    if (signal.aborted) return;
    throw new UnreachableError(`${url}: the stream broke: ${(err as Error).message}`);
  }
}

/** The message of an OpenAI-shaped error answer, with what to do about a 401. */
export function errorOf(status: number, body: unknown): string {
  const message = (body as { error?: { message?: string } }).error?.message ?? `HTTP ${status}`;
  return status === 401 || status === 403
    ? `${message} (set PDCTL_ADMIN_TOKEN to the server's admin token)`
    : message;
}

/** What `pdctl rooms` and `pdctl room` read: the journal file, or a running server (`--url`). */
export type RoomReader = Pick<JournalReader, 'rooms' | 'timeline' | 'tail' | 'close'>;

/** A query string of the values given (lists joined by commas; absent ones left out). */
function queryOf(values: Record<string, unknown>): URLSearchParams {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(values))
    if (v !== undefined && v !== null) q.set(k, Array.isArray(v) ? v.join(',') : String(v));
  return q;
}

/** The rooms and timelines of a running `pdctl serve`, through its query routes. */
export function serverRoomReader(base: string): RoomReader {
  const get = async <T>(path: string): Promise<ServerAnswer<T>> => callServer<T>(base, path);
  return {
    async rooms(filter: RoomFilter): Promise<RoomPage> {
      const q = queryOf({
        state: filter.state,
        engine: filter.engine,
        reason: filter.reason,
        request_id: filter.requestId,
        tenant: filter.tenant,
        since: filter.since,
        until: filter.until,
        in_flight_at: filter.inFlightAt,
        // The server's default leaves the hidden origins out, as the filter's does.
        origin: filter.origin ?? (filter.excludeOrigin ? undefined : 'all'),
        limit: filter.limit,
        cursor: filter.cursor,
      });
      const r = await get<{ rooms: RoomPage['rooms']; nextCursor: string | null }>(
        `/v1/rooms?${q}`,
      );
      if (r.status !== 200) throw new UsageError(errorOf(r.status, r.body));
      return { rooms: r.body.rooms, nextCursor: r.body.nextCursor };
    },
    async tail<T extends EventType = EventType>(
      filter: TailFilter<T>,
    ): Promise<JournalEventOf<T>[]> {
      const q = queryOf({
        type: filter.type,
        room: filter.room,
        engine: filter.engine,
        request_id: filter.requestId,
        limit: filter.limit,
        // The route answers oldest first from after_seq or since, else the newest.
        after_seq: filter.afterSeq,
        since: filter.since,
      });
      const events: JournalEventOf<T>[] = [];
      for await (const line of streamLines(base, `/v1/journal?${q}`, AbortSignal.timeout(5000)))
        events.push(JSON.parse(line) as JournalEventOf<T>);
      return events;
    },
    async timeline(room: string): Promise<Timeline> {
      const r = await get<Timeline>(`/v1/rooms/${encodeURIComponent(room)}`);
      if (r.status === 404) return { room: null, events: [], spans: [] };
      if (r.status !== 200) throw new UsageError(errorOf(r.status, r.body));
      return r.body;
    },
    close() {},
  };
}
