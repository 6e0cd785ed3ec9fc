/**
 * A filter that matched nothing: a quiet hour, or a name this journal does not hold
 * (`--engine d0` where the engines are `prefill-0` and `decode-0`). The second is an error that
 * lists the names it does hold, in `pdctl rooms`, `pdctl journal tail` and the query routes alike.
 */

import { ABORT_REASONS, FAILURE_REASONS } from '../room/reasons.ts';
import type { JournalNames, JournalReader } from './store.ts';

/** The names a filter gave that can miss: engines and reasons (states are checked by their list). */
export interface NamedFilter {
  engine?: string;
  reason?: string;
}

/** Which filter names a name the journal does not hold, and what to say of it. */
export interface UnknownName {
  param: 'engine' | 'reason';
  message: string;
}

/** At most this many names in a message: a fleet of hundreds of engines is summed up. */
const LISTED = 30;

function list(names: string[]): string {
  if (names.length <= LISTED) return names.join(', ');
  return `${names.slice(0, LISTED).join(', ')}, … (${names.length - LISTED} more)`;
}

/**
 * The name of `filter` that nothing in the journal carries, or null. A reason of pdctl's own
 * lists (docs/journal.md) is never unknown: no room failed for it yet is an answer. Call it only
 * when the filter matched nothing: it reads every name (a scan of the rooms).
 */
export async function unknownName(
  reader: Pick<JournalReader, 'names'>,
  filter: NamedFilter,
): Promise<UnknownName | null> {
  if (filter.engine === undefined && filter.reason === undefined) return null;
  const names: JournalNames = await reader.names();
  if (filter.engine !== undefined && !names.engines.includes(filter.engine)) {
    const held =
      names.engines.length > 0
        ? `its engines are: ${list(names.engines)}`
        : 'it holds no engine yet';
    return {
      param: 'engine',
      message: `no room or event of this journal names engine "${filter.engine}"; ${held}`,
    };
  }
  const reason = filter.reason;
  if (
    reason !== undefined &&
    !names.reasons.includes(reason) &&
    !(FAILURE_REASONS as string[]).includes(reason) &&
    !(ABORT_REASONS as string[]).includes(reason)
  ) {
    const held =
      names.reasons.length > 0
        ? `its rooms failed or were aborted for: ${list(names.reasons)}`
        : 'no room of it failed or was aborted yet';
    return {
      param: 'reason',
      message: `"${reason}" is no reason pdctl gives (docs/journal.md lists them) and no room of this journal has it; ${held}`,
    };
  }
  return null;
}
