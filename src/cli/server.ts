/**
 * Talking to a running `pdctl serve` from the command line (`--url`, env PDCTL_URL): one helper
 * for the URL, the admin token (env PDCTL_ADMIN_TOKEN), and errors that say what to do.
 */
import { UsageError } from '../errors.ts';

export const DEFAULT_URL = process.env.PDCTL_URL ?? 'http://127.0.0.1:8080';

/** The server could not be reached, or answered with something that is not JSON. */
export class UnreachableError extends Error {
  override name = 'UnreachableError';
}

export interface ServerAnswer<T> {
  status: number;
  body: T;
}

/** `path` at the server `base`, as JSON. Throws UsageError for a bad URL, UnreachableError if down. */
export async function callServer<T>(
  base: string,
  path: string,
  init: { method?: 'GET' | 'POST'; body?: unknown } = {},
): Promise<ServerAnswer<T>> {
  let url: URL;
  try {
    url = new URL(path, base);
  } catch {
    throw new UsageError(`--url must be an http(s) URL like http://127.0.0.1:8080, got "${base}"`);
  }
  const token = process.env.PDCTL_ADMIN_TOKEN;
  let res: Response;
  try {
    res = await fetch(url, {
      method: init.method ?? 'GET',
      headers: {
        ...(init.body === undefined ? {} : { 'content-type': 'application/json' }),
        ...(token ? { authorization: `Bearer ${token}` } : {}),
      },
      ...(init.body === undefined ? {} : { body: JSON.stringify(init.body) }),
      signal: AbortSignal.timeout(5000),
    });
  } catch (err) {
    const e = err as Error & { cause?: { code?: string; message?: string } };
    const cause = e.cause?.code ?? e.cause?.message;
    throw new UnreachableError(
      `cannot reach ${url}: ${cause ? `${e.message} (${cause})` : e.message}. Is pdctl serve running there? Pass --url.`,
    );
  }
  const text = await res.text();
  try {
    return { status: res.status, body: JSON.parse(text) as T };
  } catch {
    throw new UnreachableError(
      `${url} answered ${res.status} with something that is not JSON: ${text.slice(0, 200)}`,
    );
  }
}

/** The message of an OpenAI-shaped error answer, with what to do about a 401. */
export function errorOf(status: number, body: unknown): string {
  const message = (body as { error?: { message?: string } }).error?.message ?? `HTTP ${status}`;
  return status === 401 || status === 403
    ? `${message} (set PDCTL_ADMIN_TOKEN to the server's admin token)`
    : message;
}
