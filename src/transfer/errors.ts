/** The transfer core's catalogue of coded errors. Callers branch on `code`, never on the message. */
import { codedErrors } from '../errors.ts';

export const TRANSFER_ERROR_CODES = [
  'TRANSFER_BAD_ARGUMENT',
  'TRANSFER_POOL_EXISTS',
  'TRANSFER_POOL_NOT_FOUND',
  'TRANSFER_POOL_CORRUPT',
  'TRANSFER_POOL_CLOSED',
  'TRANSFER_WORKERS_CLOSED',
  /** A device pool was asked for where CUDA, or that device, is not available. */
  'TRANSFER_BACKEND_UNAVAILABLE',
  'TRANSFER_SYSTEM',
] as const;

export type TransferErrorCode = (typeof TRANSFER_ERROR_CODES)[number];

export class TransferError extends codedErrors(
  'TransferError',
  TRANSFER_ERROR_CODES,
  'TRANSFER_SYSTEM',
) {}

/** Runs a call into the addon; its coded errors come back as TransferErrors. */
export function nativeCall<T>(fn: () => T): T {
  try {
    return fn();
  } catch (err) {
    throw TransferError.from(err);
  }
}
