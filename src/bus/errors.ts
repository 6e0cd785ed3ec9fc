/** The bus's catalogue of coded errors. They cross the wire as `{ code, message }` in `nack`. */
import { codedErrors } from '../errors.ts';

export const BUS_ERROR_CODES = [
  /** A frame that is not `[kind, payload]`, an unknown kind, or a payload that fails its schema. */
  'BUS_MALFORMED_FRAME',
  /** A frame above the configured size limit. */
  'BUS_FRAME_TOO_LARGE',
  /** A message other than `hello` from a connection that has not said hello. */
  'BUS_NOT_REGISTERED',
  /**
   * A `hello` whose sender could not prove it holds a key allowed for that engine id (no proof, an
   * unknown key, another engine's key, a bad signature). Final: the engine exits.
   */
  'BUS_UNAUTHORIZED',
  /** `hello` with a protocol version this control plane does not speak. */
  'BUS_PROTOCOL_MISMATCH',
  /**
   * A `hello` from an engine running another model, or one whose KV images the other engines
   * could not load (another GGUF file, sequence count or pdctl model), than the control plane
   * serves. Final: the engine exits.
   */
  'BUS_MODEL_MISMATCH',
  /** An append whose event does not validate (bad type, data, or a room that is not the engine's). */
  'BUS_INVALID_EVENT',
  /** The journal refused the write (full disk, closed); the engine should retry later. */
  'BUS_JOURNAL_UNAVAILABLE',
  /**
   * The engine has applied events past the end of this control plane's journal: the journal was
   * restored from a backup or replaced. Nothing the engine holds can be trusted; it must rejoin as
   * a fresh process (it exits, and its supervisor starts it again).
   */
  'BUS_JOURNAL_BEHIND',
  /**
   * The control plane declared this incarnation lost while its process may still run (silent past
   * the limit: partitioned from the control plane, or hung) and moved its rooms to other engines.
   * Nothing it holds is applied any more. Final: the engine exits, and its supervisor (systemd,
   * the orchestrator) starts it again as a new incarnation.
   */
  'BUS_FENCED',
  /**
   * A `hello` naming a KV pool (by name) or a UCX descriptor (worker address) that another
   * registered engine holds: each belongs to one engine incarnation, and pages reserved in one
   * pool for two engines' rooms would be written by both. Final: the engine exits; start it with
   * its own pool.
   */
  'BUS_IDENTITY_CONFLICT',
  /**
   * The engine ran over a quota (docs/security.md: new incarnations of one engine id per minute);
   * retryable: the hello that was refused is sent again later.
   */
  'BUS_RATE_LIMITED',
  /** Not sent: the control plane could not bind its bus endpoint (the port is taken, say). */
  'BUS_BIND_FAILED',
  /** The socket or the process is closing. */
  'BUS_CLOSED',
  /** Anything else: the message keeps the original. */
  'BUS_INTERNAL',
] as const;

export type BusErrorCode = (typeof BUS_ERROR_CODES)[number];

export class BusError extends codedErrors('BusError', BUS_ERROR_CODES, 'BUS_INTERNAL') {}
