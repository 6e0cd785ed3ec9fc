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
 * The base class of one layer's coded errors: `class JournalError extends codedErrors(...) {}`.
 * Its `from` rebuilds a typed error from the plain `{ code, message }` it crossed a thread, the
 * bus or the native addon as; a code outside the catalogue becomes `fallback`, with the original
 * kept as `cause`.
 */
export function codedErrors<Code extends string>(
  name: string,
  codes: readonly Code[],
  fallback: Code,
) {
  return class extends CodedError<Code> {
    override name = name;

    static from<E extends CodedError<Code>>(
      this: new (
        code: Code,
        message: string,
        options?: { cause?: unknown },
      ) => E,
      value: unknown,
    ): E {
      // biome-ignore lint/complexity/noThisInStatic: `this` is the subclass from() was called on (JournalError, BusError, …)
      if (value instanceof this) return value;
      const v = value as { code?: unknown; message?: unknown } | null;
      const message = typeof v?.message === 'string' ? v.message : String(value);
      if (typeof v?.code === 'string' && (codes as readonly string[]).includes(v.code))
        return new this(v.code as Code, message);
      return new this(fallback, message, { cause: value });
    }
  };
}

/** Input a person typed (a flag, a time, a duration, a key) that cannot be used; the message says why. */
export class UsageError extends CodedError<'USAGE'> {
  override name = 'UsageError';

  constructor(message: string, options?: { cause?: unknown }) {
    super('USAGE', message, options);
  }
}
