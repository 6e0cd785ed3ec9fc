import type { JournalReader, TailFilter } from '../../src/journal/store.ts';
import type { EventType, JournalEventOf } from '../../src/room/events.ts';

/** Polling in tests: wait until something holds, instead of sleeping and hoping it did. */
export async function waitFor(
  what: string,
  check: () => boolean | Promise<boolean>,
  timeoutMs = 10_000,
  everyMs = 25,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > deadline)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/**
 * The newest event the filter matches, once the journal committed one. State kept in memory (a
 * cordon, an ejection) changes before its event commits: a test that saw the state waits here
 * before it reads the journal.
 */
export async function committed<T extends EventType>(
  journal: Pick<JournalReader, 'tail'>,
  filter: TailFilter<T>,
  timeoutMs = 10_000,
): Promise<JournalEventOf<T>> {
  let found: JournalEventOf<T> | undefined;
  await waitFor(
    `${String(filter.type)} committed`,
    async () => {
      [found] = await journal.tail({ ...filter, limit: 1 });
      return found !== undefined;
    },
    timeoutMs,
  );
  return found as JournalEventOf<T>;
}
