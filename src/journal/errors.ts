/** The journal's catalogue of coded errors. Callers branch on `code`, never on the message. */
import { codedErrors } from '../errors.ts';

export const JOURNAL_ERROR_CODES = [
  /** An event that does not validate (type, ids, data). */
  'JOURNAL_INVALID_EVENT',
  'JOURNAL_NOT_FOUND',
  /** The file fails its integrity check, or is not a journal. */
  'JOURNAL_CORRUPT',
  /** The file or its filesystem cannot be written (a writer needs to). */
  'JOURNAL_READ_ONLY',
  /** The file was written by a newer pdctl, or its schema is not one this version knows. */
  'JOURNAL_VERSION_CONFLICT',
  'JOURNAL_MIGRATION_FAILED',
  /** A commit failed (full disk, I/O error); the next one may succeed. */
  'JOURNAL_WRITE_FAILED',
  'JOURNAL_CLOSED',
  /** Another process holds the writer lock (SQLite) or leads the journal (PostgreSQL). */
  'JOURNAL_BUSY',
  /** The journal's server cannot be reached (PostgreSQL: refused, timed out, authentication). */
  'JOURNAL_UNREACHABLE',
  /**
   * This process led the journal and does no more: another control plane took a newer term, and
   * the journal refuses this one's writes (PostgreSQL).
   */
  'JOURNAL_FENCED',
  /** A query with a bad filter or cursor. */
  'JOURNAL_BAD_QUERY',
] as const;

export type JournalErrorCode = (typeof JOURNAL_ERROR_CODES)[number];

export class JournalError extends codedErrors(
  'JournalError',
  JOURNAL_ERROR_CODES,
  'JOURNAL_WRITE_FAILED',
) {}
