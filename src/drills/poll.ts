/** Waiting, for drills: a pause, and polling until something holds or a deadline passes. */
import type { ChildProcess } from 'node:child_process';

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Calls `probe` every `everyMs` until it returns something truthy (returned), or `timeoutMs`
 * passes (null).
 */
export async function until<T>(
  probe: () => Promise<T | null | undefined | false>,
  timeoutMs: number,
  everyMs = 25,
): Promise<T | null> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const v = await probe();
    if (v) return v;
    await sleep(everyMs);
  }
  return null;
}

/** Whether `base` answers `path` with a 2xx now (false while it is down, slow or not ready). */
export async function answersOk(base: string, path = '/health/ready'): Promise<boolean> {
  try {
    return (await fetch(`${base}${path}`, { signal: AbortSignal.timeout(1000) })).ok;
  } catch {
    return false;
  }
}

/**
 * Resolves with `child`'s exit code once it has exited — at once if it already has, by a code or
 * by a signal (null then); at once for no child.
 */
export function exited(child: ChildProcess | null): Promise<number | null> {
  return new Promise((r) =>
    child === null || child.exitCode !== null || child.signalCode !== null
      ? r(child?.exitCode ?? null)
      : child.once('exit', (code) => r(code)),
  );
}
