/**
 * Errors in OpenAI's shape (`{ error: { message, type, param, code } }`), so that OpenAI clients
 * surface them as they would OpenAI's own, and the mapping from pdctl's coded errors to them.
 */
import type { FastifyReply } from 'fastify';
import { ControlError, type ControlErrorCode } from '../control/errors.ts';
import { FlowRefusal } from '../control/flow/flow-control.ts';
import { JournalError, type JournalErrorCode } from '../journal/errors.ts';
import { TenantError } from '../tenants/admin.ts';

/** The HTTP status each coded error of the journal is answered with. */
const JOURNAL_HTTP_STATUS: Record<JournalErrorCode, number> = {
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

/** The API code of each coded error of the tenants (tenants/admin.ts). */
const TENANT_API_CODE = {
  TENANT_INVALID: 'invalid_tenant',
  TENANT_EXISTS: 'tenant_exists',
  TENANT_NOT_FOUND: 'tenant_not_found',
  TENANT_REVOKED: 'tenant_revoked',
} as const;

/** A control-plane error's API code: its own in lower case (`CONTROL_NO_ENGINES` → `no_engines`). */
function controlCode(code: ControlErrorCode): ApiErrorCode {
  return code.replace(/^CONTROL_/, '').toLowerCase() as ApiErrorCode;
}

/**
 * Every code the API answers with, as the other layers' coded errors (journal/errors.ts,
 * control/errors.ts): its HTTP status, its OpenAI error type, and what it means. A `refusal` is a
 * completion refused before it had a room: journaled as `request.refused` and counted in
 * `pdctl_requests_refused_total{reason}`. Codes of the control plane's errors are their own in
 * lower case (`CONTROL_NO_ENGINES` → `no_engines`). docs/api.md lists them all.
 */
export const API_ERRORS = {
  no_engines: {
    status: 503,
    refusal: true,
    retryAfterS: 2,
    means:
      'no engine of a role is registered, even after --admission-wait-ms (an engine restart takes about 2 s)',
  },
  engines_draining: {
    status: 503,
    refusal: true,
    retryAfterS: 5,
    means: 'every engine of a role is draining (pdctl engines drain)',
  },
  overloaded: {
    status: 429,
    refusal: true,
    retryAfterS: 1,
    means:
      "no engine had the KV pages for the request for as long as it could wait (its band's time-to-live, or x-pdctl-queue-ttl-ms)",
  },
  tenant_concurrency_limit: {
    status: 429,
    refusal: true,
    retryAfterS: 1,
    means:
      "the tenant's requests in flight were at its max concurrency for as long as the request could wait",
  },
  queue_full: {
    status: 429,
    refusal: true,
    retryAfterS: 1,
    means:
      "flow control's queue holds --queue-max requests: the lowest band is shed first (a batch request, or one of the band that has no lower band to shed)",
  },
  tenant_token_limit: {
    status: 429,
    refusal: true,
    means: 'the tenant used its tokens a minute; Retry-After says when its bucket has tokens again',
  },
  journal_unavailable: {
    status: 503,
    refusal: true,
    means: 'the journal refuses writes; nothing unjournaled is ever served',
  },
  shutting_down: {
    status: 503,
    refusal: true,
    retryAfterS: 1,
    means: 'the control plane is stopping: requests in flight finish, new ones are refused',
  },
  closed: { status: 503, refusal: true, means: 'the control plane has closed' },
  engines_timeout: {
    status: 503,
    refusal: true,
    means: 'the engines did not register in time at start',
  },
  bad_request: {
    status: 400,
    means: 'the request cannot be served as it is (the message says why)',
  },
  context_length_exceeded: {
    status: 400,
    means: 'the prompt plus max_tokens exceed the context (the message says how many fit)',
  },
  invalid_request: { status: 400, means: "the body or query does not match the route's schema" },
  request_too_large: {
    status: 413,
    means: "the request body is over the server's limit (1 MiB); the message says the limit",
  },
  invalid_parameter: { status: 400, means: 'a parameter has a value the route does not take' },
  invalid_duration: { status: 400, means: 'a duration (7d, 30m) is not one' },
  invalid_time: {
    status: 400,
    means: 'a time (ISO 8601, an age, a clock time, unix ms) is not one',
  },
  invalid_messages: { status: 400, means: "the messages do not fit the model's chat template" },
  unsupported_parameter: { status: 400, means: 'a parameter pdctl or its model does not support' },
  unsupported_media_type: { status: 415, means: 'an admin route got a body that is not JSON' },
  invalid_tenant: { status: 400, means: "a tenant's name, band or limit is not one" },
  tenant_not_found: { status: 404, means: 'no tenant of that name' },
  tenant_exists: { status: 409, means: 'a tenant of that name was added already (or revoked)' },
  tenant_revoked: { status: 409, means: 'the tenant was revoked' },
  invalid_api_key: {
    status: 401,
    type: 'invalid_request_error',
    means:
      'a serving route without a tenant key once tenants exist, or with a wrong, rotated-out or revoked one',
  },
  unauthorized: {
    status: 401,
    type: 'authentication_error',
    means: 'missing or wrong bearer token (PDCTL_ADMIN_TOKEN)',
  },
  forbidden: {
    status: 403,
    type: 'permission_error',
    means:
      "an admin route without PDCTL_ADMIN_TOKEN, asked from off loopback; a fleet query, or the journal without room=, asked with a tenant's key",
  },
  foreign_host: {
    status: 403,
    type: 'permission_error',
    means: 'an admin route without PDCTL_ADMIN_TOKEN, asked under a Host that is not loopback',
  },
  cross_origin: {
    status: 403,
    type: 'permission_error',
    means: 'an admin route asked from a web page of another origin',
  },
  not_found: { status: 404, means: 'no such route or file' },
  model_not_found: { status: 404, means: 'the model named is not the one served' },
  room_not_found: { status: 404, means: 'no room (and no request) of that id in the journal' },
  engine_not_found: { status: 404, means: 'no engine of that id is registered or connected' },
  room_terminal: { status: 409, means: 'the room (or every room of the request) has ended' },
  room_aborted: { status: 409, means: 'the room was aborted (an operator, a drain deadline)' },
  room_failed: {
    status: 503,
    type: 'server_error',
    means: 'the room failed (the message says where and why)',
  },
  room_migrated: {
    status: 503,
    type: 'server_error',
    means: 'the room moved and its continuation failed',
  },
  engine_cordoned: { status: 409, means: 'the engine is already cordoned' },
  engine_not_cordoned: { status: 409, means: 'the engine is not cordoned' },
  prune_running: { status: 409, means: 'a prune pass is already running' },
  rate_limited: {
    status: 429,
    type: 'rate_limit_error',
    means: 'a /health/deep canary ran less than a second ago',
  },
  shutdown: {
    status: 503,
    type: 'server_error',
    retryAfterS: 1,
    means: 'the control plane stopped and cut this request at its drain deadline',
  },
  internal: {
    status: 500,
    type: 'server_error',
    means: 'a defect; the control plane log has the details',
  },
} as const satisfies Record<
  string,
  { status: number; type?: string; refusal?: boolean; retryAfterS?: number; means: string }
>;
export type ApiErrorCode = keyof typeof API_ERRORS;

/** The codes of completions refused before they had a room (`request.refused` reasons). */
export const REFUSAL_CODES = (Object.keys(API_ERRORS) as ApiErrorCode[]).filter(
  (c) => (API_ERRORS[c] as { refusal?: boolean }).refusal === true,
);

/** The completion routes: where a refusal happens, and the routes `/metrics` counts answers of. */
export const COMPLETION_ROUTES = ['/v1/completions', '/v1/chat/completions'] as const;

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

  /** The error of `code` (API_ERRORS), with its status, type and retry-after. */
  static of(code: ApiErrorCode, message: string, param: string | null = null): ApiError {
    const e = API_ERRORS[code] as { status: number; type?: string; retryAfterS?: number };
    return new ApiError(e.status, message, e.type, code, param, e.retryAfterS ?? null);
  }

  body(): ApiErrorBody {
    return {
      error: { message: this.message, type: this.type, param: this.param, code: this.code },
    };
  }
}

export function roomNotFound(room: string): ApiError {
  return ApiError.of('room_not_found', `no room ${room} in the journal`, 'room');
}

/** Any error thrown by a route, as the ApiError a client should see (`bodyBytes`: the body limit). */
export function toApiError(err: unknown, bodyBytes?: number): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof ControlError) {
    const e = ApiError.of(controlCode(err.code), err.message);
    // Flow control says when the tenant's bucket has tokens again (control/flow/).
    const retry = err instanceof FlowRefusal ? err.retryAfterS : null;
    return retry === null ? e : new ApiError(e.status, e.message, e.type, e.code, null, retry);
  }
  if (err instanceof TenantError) return ApiError.of(TENANT_API_CODE[err.code], err.message);
  if (err instanceof JournalError)
    return new ApiError(JOURNAL_HTTP_STATUS[err.code], err.message, undefined, err.code);
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
    return ApiError.of('invalid_request', what, extra ?? (path || null));
  }
  if (e?.code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
    const limit =
      bodyBytes === undefined
        ? 'its limit'
        : `${bodyBytes} bytes${bodyBytes % (1 << 20) === 0 ? ` (${bodyBytes / (1 << 20)} MiB)` : ''}`;
    return ApiError.of(
      'request_too_large',
      `the request body is over this server's limit of ${limit}: send a shorter prompt, or fewer or shorter messages`,
    );
  }
  if (typeof e?.statusCode === 'number' && e.statusCode >= 400 && e.statusCode < 500) {
    const message =
      e.code === 'FST_ERR_CTP_INVALID_JSON_BODY' || e.code === 'FST_ERR_CTP_EMPTY_JSON_BODY'
        ? `the body is not valid JSON: ${e.message}`
        : (e.message ?? 'bad request');
    return new ApiError(e.statusCode, message, 'invalid_request_error', e.code ?? null);
  }
  return ApiError.of('internal', 'internal error; the control plane log has the details');
}

export function sendError(reply: FastifyReply, err: ApiError): FastifyReply {
  const retryAfter = err.retryAfterS ?? (err.status === 429 ? 1 : null);
  if (retryAfter !== null) reply.header('retry-after', String(retryAfter));
  return reply.code(err.status).send(err.body());
}
