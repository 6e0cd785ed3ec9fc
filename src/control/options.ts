/**
 * The control plane's options, and its defaults in one frozen object (as the engine's are, in
 * src/engine/options.ts): what a caller leaves out is taken from `CONTROL_DEFAULTS`, once, in
 * `resolveControlOptions`, and nowhere inline.
 */

import type { Admission } from '../bus/admission.ts';
import { DEFAULT_MAX_FRAME_BYTES, maxRequestTextBytes } from '../bus/protocol.ts';
import type { BusTransport } from '../bus/transport.ts';
import type { JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import type { ModelInfo, Sampling } from '../model/executor.ts';
import type { Clock } from '../ports/clock.ts';
import type { Ids } from '../ports/ids.ts';
import type { StateDeadlinesMs } from '../room/states.ts';
import type { Band } from '../tenants/book.ts';
import type { RouterPolicy } from './routing/router.ts';

/** What every control plane has a default for; units are in the names. */
export interface ControlDefaults {
  bus: string;
  maxFrameBytes: number;
  abortGraceMs: number;
  migrationLimit: number;
  migrationWaitMs: number;
  retryLimit: number;
  journalOutageGraceMs: number;
  maxRoomsPerEngine: number;
  engineExpiryMs: number;
  engineExpiryCheckMs: number;
  outageCheckMs: number;
  router: RouterPolicy;
  routerOverlapWeight: number;
  kvBlockTokens: number;
  checkpointEveryEvents: number;
  checkpointEveryMs: number;
  pairAvoidMs: number;
  pairAvoidMaxMs: number;
}

export const CONTROL_DEFAULTS: Readonly<ControlDefaults> = Object.freeze({
  /** Bus endpoint to bind: a free loopback port. */
  bus: 'tcp://127.0.0.1:0',
  maxFrameBytes: DEFAULT_MAX_FRAME_BYTES,
  /** How long after `room.abort_requested` the room is marked aborted even without both releases. */
  abortGraceMs: 2000,
  /**
   * Migrations per request: when an engine dies under a live client, its rooms continue on a
   * healthy pair this many times; the next loss fails the request (`migration_limit_reached`).
   * 0 turns migration off (the engine's replacement fails its rooms, `engine_restarted`).
   */
  migrationLimit: 2,
  /** How long a migrating request waits for a healthy pair. */
  migrationWaitMs: 15_000,
  /**
   * Times one request is tried again on another pair when its room failed before any token
   * reached the client, for a reason another pair may not share (reasons.ts FAILURE_BLAME); 0:
   * never (the client gets the failure).
   */
  retryLimit: 1,
  /**
   * The journal has refused writes for this long: every request in flight is answered now (503,
   * or an error event on a stream) instead of waiting out the outage, and its room is failed
   * (`journal_unavailable`) once the journal takes writes again.
   */
  journalOutageGraceMs: 1000,
  /**
   * Rooms in flight per decode engine: past it on every decode engine, a request is refused
   * (429 `overloaded`) whatever pages are free.
   */
  maxRoomsPerEngine: 512,
  /** An engine silent this long with no live rooms leaves the registry. */
  engineExpiryMs: 600_000,
  /** How often silent engines are looked for. */
  engineExpiryCheckMs: 60_000,
  /** How often the journal-outage answerer looks at the journal's health. */
  outageCheckMs: 250,
  /** How a new room's pair is chosen (routing/router.ts): by prefix overlap against load. */
  router: 'kv' as RouterPolicy,
  /** Under `kv`: a token to compute against a token queued (routing/router.ts). */
  routerOverlapWeight: 4,
  /** Tokens per prefix block: the engines' `--kv-block-tokens` must be the same. */
  kvBlockTokens: 64,
  /**
   * A state checkpoint (control/checkpoint) after this many committed events, or this long if
   * anything changed: a restart folds at most about that many events of the journal.
   */
  checkpointEveryEvents: 50_000,
  checkpointEveryMs: 60_000,
  /**
   * A pair whose transfer failed or stalled is avoided this long (pairs.ts PairHealth); failing
   * again after the pause doubles it, up to `pairAvoidMaxMs`.
   */
  pairAvoidMs: 5000,
  pairAvoidMaxMs: 60_000,
});

export interface ControlPlaneOptions extends Partial<ControlDefaults> {
  /**
   * The journal (any backend behind `JournalStore`), opened by the caller and owned from then on:
   * `close()` drains it.
   */
  journal: JournalStore;
  /**
   * Who may join as which engine (bus/admission.ts): the control plane's key pair and the engine
   * keys it allows. Every hello must prove it holds one.
   */
  admission: Admission;
  /**
   * CURVE on the bus (encryption; only allowed keys complete the handshake). Default: on unless the
   * bus is `ipc://` in a private directory. False is `--insecure-bus`.
   */
  curve?: boolean;
  /**
   * When an engine counts as alive, stale or stalled (engine-view.ts); readiness, routing, the
   * ladder and the API all read this one policy. Default `DEFAULT_LIVENESS`.
   */
  liveness?: Partial<import('./engines/engine-view.ts').LivenessPolicy>;
  /** Per-state deadlines for new rooms (defaults in src/journal/states.ts). */
  deadlinesMs?: Partial<StateDeadlinesMs>;
  /** Tokenizer for prompt sizes; must match the engines' model. Default: the built-in model. */
  model?: ModelInfo;
  log: Logger;
  version: string;
  /** Time and timers. Default: the process's clock; the simulator's is virtual (ports/clock.ts). */
  clock?: Clock;
  /** Room ids. Default: the process's (ports/ids.ts). */
  ids?: Ids;
  /** The bus's sockets. Default: ZeroMQ (bus/transport.ts). */
  transport?: BusTransport;
}

export interface SubmitRequest {
  prompt: string;
  maxTokens: number;
  /** Stop sequences (at most 4, 1–200 characters each): the decode engine stops at the first. */
  stop?: string[];
  /** The prompt's tokens when the caller has them (a chat in the model's template). */
  tokens?: number[];
  sampling?: Sampling;
  signal?: AbortSignal;
  /** Who asks, journaled as the `source` of `room.created`. Default `api`. */
  source?: string;
  /**
   * A canary for this engine (recovery/outliers.ts): the room goes through it, ejected or not,
   * and through no other engine of its role.
   */
  probe?: string;
  /** With `probe`: engines of the other role the canary must not go through (they failed one). */
  probeAvoid?: readonly string[];
  /** The HTTP request's id and W3C traceparent, journaled on `room.created` (and its migrations'). */
  requestId?: string;
  traceparent?: string;
  /** The tenant whose key it came with, journaled likewise; absent on an open API. */
  tenant?: { name: string; band: Band };
  /** How long it waited in flow control's queue before its room (journaled on the first room). */
  waitedMs?: number;
  /**
   * Taken only where its engines keep room for one more request of its size after it (a decode
   * slot and the pages): a batch request while interactive ones come (control/flow/).
   */
  headroom?: boolean;
}

/** The longest prompt, in UTF-8 bytes: what fits in a `room.created` event on the bus. */
export const MAX_PROMPT_BYTES = maxRequestTextBytes();

/** Most tokens one completion may ask for. */
export const MAX_TOKENS_LIMIT = 100_000;
