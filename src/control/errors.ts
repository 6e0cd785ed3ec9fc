/** The control plane's catalogue of coded errors, with the HTTP status each maps to. */

export const CONTROL_ERROR_CODES = {
  /** The request is invalid (empty prompt, bad max tokens). */
  CONTROL_BAD_REQUEST: 400,
  /** No engine has the KV pages for the request now (it would fit an idle one): retry shortly. */
  CONTROL_OVERLOADED: 429,
  /** No prefill or no decode engine is registered with a fresh heartbeat. */
  CONTROL_NO_ENGINES: 503,
  /** The journal refused the write: nothing unjournaled is served. */
  CONTROL_JOURNAL_UNAVAILABLE: 503,
  /** The control plane is draining or closed. */
  CONTROL_CLOSED: 503,
  /** Engines did not register in time at start. */
  CONTROL_ENGINES_TIMEOUT: 503,
} as const;

export type ControlErrorCode = keyof typeof CONTROL_ERROR_CODES;

export class ControlError extends Error {
  readonly code: ControlErrorCode;
  readonly status: number;

  constructor(code: ControlErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'ControlError';
    this.code = code;
    this.status = CONTROL_ERROR_CODES[code];
  }
}
