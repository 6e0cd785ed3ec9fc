/** The arguments every backend's store checks the same way, with the same messages. */
import { JournalError } from './errors.ts';
import type { PruneOptions } from './store.ts';

export function checkAfterSeq(afterSeq: number): void {
  if (!Number.isSafeInteger(afterSeq) || afterSeq < 0) {
    throw new JournalError(
      'JOURNAL_BAD_QUERY',
      `afterSeq must be a non-negative integer, got ${afterSeq}`,
    );
  }
}

export function checkCursor(name: string, seq: number): void {
  if (typeof name !== 'string' || name.length === 0 || name.length > 200) {
    throw new JournalError(
      'JOURNAL_BAD_QUERY',
      'cursor name must be a non-empty string of at most 200 characters',
    );
  }
  if (!Number.isSafeInteger(seq) || seq < 0) {
    throw new JournalError(
      'JOURNAL_BAD_QUERY',
      `cursor seq must be a non-negative integer, got ${seq}`,
    );
  }
}

/** The prune's chunk size (default 500 rooms per transaction), once its arguments are checked. */
export function checkPrune(opts: PruneOptions): number {
  const chunkRooms = opts.chunkRooms ?? 500;
  if (!Number.isSafeInteger(opts.cutoffTs) || opts.cutoffTs < 0) {
    throw new JournalError('JOURNAL_BAD_QUERY', 'prune cut-off must be unix milliseconds');
  }
  const events = opts.eventsCutoffTs;
  if (events !== undefined && (!Number.isSafeInteger(events) || events < 0)) {
    throw new JournalError('JOURNAL_BAD_QUERY', 'the events cut-off must be unix milliseconds');
  }
  if (events !== undefined && events > opts.cutoffTs) {
    // Events of rooms that are kept would otherwise be scanned again on every pass.
    throw new JournalError(
      'JOURNAL_BAD_QUERY',
      'events of no room must be kept at least as long as rooms: the events cut-off may not be later than the rooms cut-off',
    );
  }
  if (!Number.isInteger(chunkRooms) || chunkRooms < 1 || chunkRooms > 100_000) {
    throw new JournalError('JOURNAL_BAD_QUERY', 'chunkRooms must be an integer from 1 to 100000');
  }
  return chunkRooms;
}
