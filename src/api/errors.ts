/**
 * Errors in OpenAI's shape (`{ error: { message, type, param, code } }`), so that OpenAI clients
 * surface them as they would OpenAI's own, and the mapping from pdctl's coded errors to them.
 */
import type { FastifyReply } from 'fastify';
import { ControlError, type ControlErrorCode } from '../control/errors.ts';
import { JournalError, type JournalErrorCode } from '../journal/errors.ts';

/** The HTTP status each coded error of a lower layer is answered with. */
export const HTTP_STATUS: Record<ControlErrorCode | JournalErrorCode, number> = {
  CONTROL_BAD_REQUEST: 400,
  CONTROL_CONTEXT_LENGTH_EXCEEDED: 400,
  CONTROL_OVERLOADED: 429,
  CONTROL_NO_ENGINES: 503,
  CONTROL_ENGINES_DRAINING: 503,
  CONTROL_JOURNAL_UNAVAILABLE: 503,
  CONTROL_CLOSED: 503,
  CONTROL_ENGINES_TIMEOUT: 503,
  CONTROL_INTERNAL: 500,
  JOURNAL_INVALID_EVENT: 400,
  JOURNAL_BAD_QUERY: 400,
  JOURNAL_NOT_FOUND: 404,
  JOURNAL_CORRUPT: 500,
  JOURNAL_VERSION_CONFLICT: 500,
  JOURNAL_MIGRATION_FAILED: 500,
  JOURNAL_READ_ONLY: 503,
  JOURNAL_WRITE_FAILED: 503,
  JOURNAL_CLOSED: 503,
  JOURNAL_BUSY: 503,
  JOURNAL_UNREACHABLE: 503,
  JOURNAL_FENCED: 503,
};

/**
 * Seconds a client should wait before it retries a refusal that passes (a `retry-after` header):
 * an engine restart takes about 2 s; a drain is an operator's, and another server may take the
 * request meanwhile.
 */
const RETRY_AFTER_S: Partial<Record<ControlErrorCode, number>> = {
  CONTROL_NO_ENGINES: 2,
  CONTROL_ENGINES_DRAINING: 5,
};

export interface ApiErrorBody {
  error: { message: string; type: string; param: string | null; code: string | null };
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly type = status === 429
      ? 'rate_limit_error'
      : status >= 500
        ? 'server_error'
        : 'invalid_request_error',
    readonly code: string | null = null,
    readonly param: string | null = null,
    /** Seconds a client should wait before it retries (a `retry-after` header); 429s get 1. */
    readonly retryAfterS: number | null = null,
  ) {
    super(message);
    this.name = 'ApiError';
  }

  body(): ApiErrorBody {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
    };
  }
}

export function roomNotFound(room: string): ApiError {
  return new ApiError(
    404,
    `no room ${room} in the journal`,
    'invalid_request_error',
    'room_not_found',
    'room',
  );
}

/** Any error thrown by a route, as the ApiError a client should see. */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof ControlError) {
    // OpenAI-style codes: CONTROL_JOURNAL_UNAVAILABLE → journal_unavailable.
    return new ApiError(
      HTTP_STATUS[err.code],
      err.message,
      undefined,
      err.code.replace(/^CONTROL_/, '').toLowerCase(),
      null,
      RETRY_AFTER_S[err.code] ?? null,
    );
  }
  if (err instanceof JournalError)
    return new ApiError(HTTP_STATUS[err.code], err.message, undefined, err.code);
  const e = err as {
    statusCode?: number;
    code?: string;
    message?: string;
    validation?: unknown[];
    validationContext?: string;
  };
  if (e?.validation) {
    // The first schema error, as "max_tokens must be integer", naming the field.
    const first = e.validation[0] as
      | { instancePath?: string; message?: string; params?: { additionalProperty?: string } }
      | undefined;
    const path = (first?.instancePath ?? '').replace(/^\//, '').replaceAll('/', '.');
    const extra = first?.params?.additionalProperty;
    const what = extra
      ? `unknown field "${extra}"${path ? ` in ${path}` : ''}`
      : `${path || e.validationContext || 'body'} ${first?.message ?? 'is invalid'}`;
    return new ApiError(
      400,
      what,
      'invalid_request_error',
      'invalid_request',
      extra ?? (path || null),
    );
  }
  if (typeof e?.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    const message =
      e.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || e.code === 'FST_ERR_CTP_EMPTY_JSON_BODY'
        ? `the body is not valid JSON: ${e.message}`
        : (e.message ?? 'bad request');
    return new ApiError(e.statusCode, message, 'invalid_request_error', e.code ?? null);
  }
  return new ApiError(
    500,
    'internal error; the control plane log has the details',
    'server_error',
    'internal',
  );
}

export function sendError(reply: FastifyReply, err: ApiError): FastifyReply {
  const retryAfter = err.retryAfterS ?? (err.status === 429 ? 1 : null);
  if (retryAfter !== null) reply.header('retry-after', String(retryAfter));
  return reply.code(err.status).send(err.body());
}
