/**
 * The one coded-error base. Every layer has a catalogue of codes (journal, bus, transfer, control)
 * and a subclass of `CodedError` for it; callers branch on `code`, never on the message. Codes say
 * what went wrong, not how to answer it: the API maps them to HTTP statuses (src/api/errors.ts),
 * the CLI to exit codes.
 */
export class CodedError<Code extends string = string> extends Error {
  constructor(
    readonly code: Code,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  /** Plain form for crossing a thread or the bus: `{ code, message }`. */
  toJSON(): { code: Code; message: string } {
    return { code: this.code, message: this.message };
  }
}

/**
 * A catalogue's `from`: rebuilds a typed error from its plain form (`{ code, message }`, as it
 * crossed a thread, the bus or the native addon). A code outside `codes` becomes `fallback`, with
 * the original kept as `cause`.
 */
export function codedFrom<Code extends string, E extends CodedError<Code>>(
  value: unknown,
  codes: readonly Code[],
  fallback: Code,
  make: (code: Code, message: string, options?: { cause?: unknown }) => E,
  is: (value: unknown) => value is E,
): E {
  if (is(value)) return value;
  const v = value as { code?: unknown; message?: unknown } | null;
  const message = typeof v?.message === 'string' ? v.message : String(value);
  if (typeof v?.code === 'string' && (codes as readonly string[]).includes(v.code))
    return make(v.code as Code, message);
  return make(fallback, message, { cause: value });
}

/** Input a person typed (a flag, a time, a duration, a key) that cannot be used; the message says why. */
export class UsageError extends CodedError<'USAGE'> {
  override name = 'UsageError';

  constructor(message: string, options?: { cause?: unknown }) {
    super('USAGE', message, options);
  }
}
