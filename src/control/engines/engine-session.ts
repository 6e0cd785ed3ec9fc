/**
 * One engine as the control plane holds it, split by who writes each part: its identity (the
 * admitted hello), its event stream (engine-link.ts), its health (engine-health.ts) and the pages
 * promised to it (pages/page-ledger.ts). Everything outside src/control/ reads engine-view.ts instead.
 */
import type { EngineMessage, KvRemote, KvSend } from '../../bus/protocol.ts';
import type { PeerId } from '../../bus/server.ts';
import type { KvShape, ModelRuntime } from '../../model/executor.ts';
import type { JournalEvent } from '../../room/events.ts';

/** Who an engine is, as its admitted hello said: fixed for the session (engine-link.ts writes it once). */
export interface EngineIdentity {
  readonly engine: string;
  readonly role: 'prefill' | 'decode';
  readonly incarnation: string;
  /** The public key its hello was admitted with: a new incarnation must bring the same one. */
  readonly key: string;
  readonly pid: number;
  /** The bus connection that speaks for it. */
  readonly peer: PeerId;
  readonly pool: string;
  readonly epoch: number;
  readonly pages: number;
  readonly pageBytes: number;
  /** How its KV takes pages, as its hello says; null: unknown, its pages are not counted. */
  readonly kv: KvShape | null;
  /** Its model and KV layout, as its hello says; null: the built-in model. */
  readonly model: string | null;
  /** What llama.cpp gave its model, as its hello says; null: the built-in model. */
  readonly runtime: ModelRuntime | null;
  /** It accepts `inject_fault` commands (drills). */
  readonly faultInjection: boolean;
  /** The CUDA device its pool's pages are on; null: host shared memory. */
  readonly kvDevice: number | null;
  /** Which host it runs on (hello `host`; src/transfer/host.ts); null: it did not say. */
  readonly host: string | null;
  /** Where a UCX peer sends a decode engine's rooms' KV; null: shared memory only. */
  readonly kvRemote: KvRemote | null;
  /** How it sends KV (hello `kvSend`; control/intake/pairs.ts): `auto` when it did not say. */
  readonly kvSend: KvSend;
  /** A prefill engine's prefix cache (hello `prefix`): block size and most blocks; null: none. */
  readonly prefix: { blockTokens: number; capacityBlocks: number } | null;
  readonly connectedAt: number;
}

/** The session's event stream to and from the engine: owned by engine-link.ts. */
export interface EngineDelivery {
  /** Events from the journal are sent only once replay for this hello is done. */
  live: boolean;
  /** This hello's append stream: its number, the next `n` expected, and whether a gap broke it. */
  session: number;
  nextN: number;
  broken: boolean;
  /** Highest seq covered for this engine (replay or live); later publishes skip anything at or below. */
  sentSeq: number;
  /** Seq of the last event actually sent to this engine: the next one's `prevSeq`. */
  lastDelivered: number;
  /** Live events that arrived while the replay was being read, sent right after it. */
  buffer: JournalEvent[];
  /**
   * The journal's head when this incarnation was first welcomed (null until then): a reconnect of
   * the same process has had everything of its rooms up to it, and must get everything after it,
   * terminal rooms too — even when it applied no event yet (`lastSeq` 0).
   */
  joinedSeq: number | null;
}

/**
 * What shows whether the engine works: heartbeats, progress, canaries. Written by
 * engine-health.ts (heartbeats, progress) and the canary's verdicts; read by stalls.ts.
 */
export interface EngineHealth {
  lastSeen: number;
  heartbeat: EngineMessage<'heartbeat'> | null;
  /** Heartbeats received in this session. */
  beats: number;
  /**
   * The last event sent to it before its previous heartbeat (`lastDelivered` then), and since when
   * it has been behind (0: it is not): the time of that previous heartbeat, once the next one
   * shows the event still not applied. A healthy engine applies within a heartbeat; one whose bus
   * loop stopped consuming stays behind.
   */
  owedSeq: number;
  behindSince: number;
  /** When the engine's transfer path last moved: a transfer completed, or none was in flight. */
  transferMovedAt: number;
  /** When its work loop last moved: its `work` tick changed, or nothing was queued for it. */
  workMovedAt: number;
  /** When it last showed progress: a transition of one of its rooms, a token, a work tick. */
  progressAt: number;
  /** Canaries in a row that failed in a stage it owns, since when, and the last one's reason. */
  canaryFailures: number;
  canaryFailingSince: number;
  canaryReason: string;
}

/**
 * What the control plane has promised it: owned by the page ledger (its live rooms are the room
 * book's, room-book.ts `liveOn`).
 */
export interface EngineLoad {
  /** Pages promised to its rooms (pages/page-ledger.ts): admitted, and not yet released by it. */
  reservedPages: number;
}

/** One engine as the control plane knows it, split by who writes each part. */
export interface EngineSession extends EngineIdentity {
  readonly delivery: EngineDelivery;
  readonly health: EngineHealth;
  readonly load: EngineLoad;
}
