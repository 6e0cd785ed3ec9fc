import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { CONTROL_ERROR_CODES, ControlError } from '../control/errors.ts';
import { API_ERRORS, ApiError, REFUSAL_CODES, toApiError } from './errors.ts';

describe('the API error catalogue', () => {
  it('answers every control-plane error with a code of the catalogue, its status and retry-after', () => {
    for (const code of CONTROL_ERROR_CODES) {
      const e = toApiError(new ControlError(code, 'm'));
      expect(Object.keys(API_ERRORS), code).toContain(e.code);
      expect(e.status, code).toBe(API_ERRORS[e.code as keyof typeof API_ERRORS].status);
    }
    const noEngines = toApiError(new ControlError('CONTROL_NO_ENGINES', 'm'));
    expect([noEngines.status, noEngines.code, noEngines.retryAfterS]).toEqual([
      503,
      'no_engines',
      2,
    ]);
    const draining = toApiError(new ControlError('CONTROL_ENGINES_DRAINING', 'm'));
    expect([draining.status, draining.retryAfterS]).toEqual([503, 5]);
    expect(toApiError(new ControlError('CONTROL_OVERLOADED', 'm')).type).toBe('rate_limit_error');
    expect(toApiError(new ControlError('CONTROL_CONTEXT_LENGTH_EXCEEDED', 'm')).status).toBe(400);
  });

  it('makes an error of a code with its status and type', () => {
    const e = ApiError.of('unauthorized', 'who are you');
    expect([e.status, e.type, e.code, e.param]).toEqual([
      401,
      'authentication_error',
      'unauthorized',
      null,
    ]);
    expect(ApiError.of('room_not_found', 'no', 'room').body()).toEqual({
      error: {
        message: 'no',
        type: 'invalid_request_error',
        param: 'room',
        code: 'room_not_found',
      },
    });
  });

  it('counts as refusals only completions refused before they had a room', () => {
    expect(REFUSAL_CODES).toEqual([
      'no_engines',
      'engines_draining',
      'overloaded',
      'tenant_concurrency_limit',
      'queue_full',
      'tenant_token_limit',
      'journal_unavailable',
      'shutting_down',
      'closed',
      'engines_timeout',
    ]);
  });

  it('is listed whole in docs/api.md', () => {
    const doc = readFileSync(new URL('../../docs/api.md', import.meta.url), 'utf8');
    for (const code of Object.keys(API_ERRORS))
      expect(doc, code).toMatch(new RegExp(`^\\| \`${code}\` +\\|`, 'm'));
  });
});
