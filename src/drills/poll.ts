/** Waiting, for drills: a pause, and polling until something holds or a deadline passes. */

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
