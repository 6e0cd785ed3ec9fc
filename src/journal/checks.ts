/** The arguments every backend's store checks the same way, with the same messages. */
import { JournalError } from './errors.ts';

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
export function checkPrune(opts: { cutoffTs: number; chunkRooms?: number }): number {
  const chunkRooms = opts.chunkRooms ?? 500;
  if (!Number.isSafeInteger(opts.cutoffTs) || opts.cutoffTs < 0) {
    throw new JournalError('JOURNAL_BAD_QUERY', 'prune cut-off must be unix milliseconds');
  }
  if (!Number.isInteger(chunkRooms) || chunkRooms < 1 || chunkRooms > 100_000) {
    throw new JournalError('JOURNAL_BAD_QUERY', 'chunkRooms must be an integer from 1 to 100000');
  }
  return chunkRooms;
}
