/** The journal's catalogue of coded errors. Callers branch on `code`, never on the message. */

export const JOURNAL_ERROR_CODES = {
  JOURNAL_INVALID_EVENT: 400,
  JOURNAL_NOT_FOUND: 404,
  JOURNAL_CORRUPT: 500,
  /** The file or its filesystem cannot be written (a writer needs to). */
  JOURNAL_READ_ONLY: 503,
  JOURNAL_VERSION_CONFLICT: 500,
  JOURNAL_MIGRATION_FAILED: 500,
  JOURNAL_WRITE_FAILED: 503,
  JOURNAL_CLOSED: 503,
  JOURNAL_BUSY: 503,
  JOURNAL_BAD_QUERY: 400,
} as const;

export type JournalErrorCode = keyof typeof JOURNAL_ERROR_CODES;

export class JournalError extends Error {
  readonly code: JournalErrorCode;
  /** HTTP status for the API layer. */
  readonly status: number;

  constructor(code: JournalErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'JournalError';
    this.code = code;
    this.status = JOURNAL_ERROR_CODES[code];
  }

  /** Plain form for crossing a thread or the bus: `{ code, message }`. */
  toJSON(): { code: JournalErrorCode; message: string } {
    return { code: this.code, message: this.message };
  }

  /** Rebuilds a typed error from its plain form; an unknown code keeps the original as `cause`. */
  static from(value: unknown): JournalError {
    if (value instanceof JournalError) return value;
    const v = value as { code?: unknown; message?: unknown } | null;
    const message = typeof v?.message === 'string' ? v.message : String(value);
    if (typeof v?.code === 'string' && Object.hasOwn(JOURNAL_ERROR_CODES, v.code)) {
      return new JournalError(v.code as JournalErrorCode, message);
    }
    return new JournalError('JOURNAL_WRITE_FAILED', message, { cause: value });
  }
}
