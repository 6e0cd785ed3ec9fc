/** The control plane's catalogue of coded errors. */
import { codedErrors } from '../errors.ts';

export const CONTROL_ERROR_CODES = [
  /** The request is invalid (empty prompt, bad max tokens, a pool that could never hold it). */
  'CONTROL_BAD_REQUEST',
  /** Prompt and max tokens together exceed the model's context (OpenAI's context_length_exceeded). */
  'CONTROL_CONTEXT_LENGTH_EXCEEDED',
  /** No engine has the KV pages for the request now (it would fit an idle one): retry shortly. */
  'CONTROL_OVERLOADED',
  /** The tenant's requests in flight are at its max concurrency (it waited its time-to-live). */
  'CONTROL_TENANT_CONCURRENCY_LIMIT',
  /** The tenant used its tokens a minute (it waited its time-to-live). */
  'CONTROL_TENANT_TOKEN_LIMIT',
  /** Flow control's queue is at its bound: the lowest band is shed first (control/flow/). */
  'CONTROL_QUEUE_FULL',
  /** No prefill or no decode engine is registered with a fresh heartbeat. */
  'CONTROL_NO_ENGINES',
  /** Every engine of a role heartbeats but drains (`pdctl engines drain`): none takes new rooms. */
  'CONTROL_ENGINES_DRAINING',
  /** The journal refused the write: nothing unjournaled is served. */
  'CONTROL_JOURNAL_UNAVAILABLE',
  /** The control plane is draining or closed. */
  'CONTROL_CLOSED',
  /** Engines did not register in time at start. */
  'CONTROL_ENGINES_TIMEOUT',
  /** Anything else (a bug): the message keeps the original. */
  'CONTROL_INTERNAL',
] as const;

export type ControlErrorCode = (typeof CONTROL_ERROR_CODES)[number];

export class ControlError extends codedErrors(
  'ControlError',
  CONTROL_ERROR_CODES,
  'CONTROL_INTERNAL',
) {
  /**
   * What an operator can do about it (which engines, which command takes one back): logged with
   * the refusal, never sent to the client, whose message says what a client can do.
   */
  operatorHint?: string;
}

/** A refusal with a client's message, and the operator's hint apart (`operatorHint`). */
export function refusal(
  code: ControlErrorCode,
  message: string,
  operatorHint: string,
): ControlError {
  const e = new ControlError(code, message);
  e.operatorHint = operatorHint;
  return e;
}
