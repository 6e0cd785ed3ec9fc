/** The transfer core's catalogue of coded errors. Callers branch on `code`, never on the message. */

export const TRANSFER_ERROR_CODES = [
  'TRANSFER_BAD_ARGUMENT',
  'TRANSFER_POOL_EXISTS',
  'TRANSFER_POOL_NOT_FOUND',
  'TRANSFER_POOL_CORRUPT',
  'TRANSFER_POOL_CLOSED',
  'TRANSFER_ENGINE_CLOSED',
  /** A device pool was asked for where CUDA, or that device, is not available. */
  'TRANSFER_BACKEND_UNAVAILABLE',
  'TRANSFER_SYSTEM',
] as const;

export type TransferErrorCode = (typeof TRANSFER_ERROR_CODES)[number];

export class TransferError extends Error {
  readonly code: TransferErrorCode;

  constructor(code: TransferErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'TransferError';
    this.code = code;
  }

  /** Rebuilds a typed error from the addon's `{ code, message }`; unknown codes keep the cause. */
  static from(err: unknown): TransferError {
    if (err instanceof TransferError) return err;
    const e = err as { code?: unknown; message?: unknown };
    const message = typeof e?.message === 'string' ? e.message : String(err);
    if (
      typeof e?.code === 'string' &&
      (TRANSFER_ERROR_CODES as readonly string[]).includes(e.code)
    ) {
      return new TransferError(e.code as TransferErrorCode, message);
    }
    return new TransferError('TRANSFER_SYSTEM', message, { cause: err });
  }
}
