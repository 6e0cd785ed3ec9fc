/**
 * The control-plane core: the journal, the bus, the engines, and the rooms between them. It
 * creates rooms for requests, folds every committed room event into its view, finishes aborts,
 * and hands each committed event to the engine links (engine-link.ts: hellos, replay, appends,
 * delivery). Token chunks flow from decode engines to the caller of `submit`; when an engine is
 * lost, its clients' rooms continue elsewhere (migration.ts).
 * `ControlPlane.start` is what the composition root (src/app/) builds the stack on.
 */

import { type Admission, needsCurve } from '../bus/admission.ts';
import type { DropReason } from '../bus/protocol.ts';
import {
  type CommandName,
  DEFAULT_MAX_FRAME_BYTES,
  type EngineMessage,
  maxRequestTextBytes,
  type RoomRequest,
  requestTextBytes,
} from '../bus/protocol.ts';
import type { BusServerHandlers } from '../bus/server.ts';
import { BusServer } from '../bus/server.ts';
import type { JournalEvent } from '../journal/events.ts';
import { newRoomId } from '../journal/ids.ts';
import { type Room, reduce } from '../journal/reducer.ts';
import { isTerminal, LIVE_STATES, type StateDeadlinesMs } from '../journal/states.ts';
import type { AppendResult, JournalHealth, JournalStore, Subscription } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { DeterministicModel } from '../model/deterministic.ts';
import type { ModelInfo, Sampling } from '../model/executor.ts';
import { Aborts, releasedByBoth } from './aborts.ts';
import {
  recordCanaryFailed,
  recordCanaryPassed,
  recordHeartbeat,
  recordProgress,
} from './engine-health.ts';
import { type ControlCounters, EngineLink } from './engine-link.ts';
import { ControlError } from './errors.ts';
import { JournalOutage } from './journal-outage.ts';
import { LoopLag } from './loop-lag.ts';
import { Migrator } from './migration.ts';
import { PageLedger } from './page-ledger.ts';
import { choosePair, isTransportFailure, type Pair, PairHealth, unreachable } from './pairs.ts';
import { EngineRegistry, type EngineSession } from './registry.ts';
import { DEFAULT_STALL_POLICY, findStalls, type Stall, type StallPolicy } from './stalls.ts';
import { RoomEndedError, RoomStream } from './streams.ts';

export interface ControlPlaneOptions {
  /**
   * The journal (any backend behind `JournalStore`), opened by the caller and owned from then on:
   * `close()` drains it.
   */
  journal: JournalStore;
  /** Bus endpoint to bind. Default `tcp://127.0.0.1:0` (a free port). */
  bus?: string;
  /**
   * Who may join as which engine (admission.ts): the control plane's key pair and the engine keys
   * it allows. Every hello must prove it holds one.
   */
  admission: Admission;
  /**
   * CURVE on the bus (encryption; only allowed keys complete the handshake). Default: on unless the
   * bus is `ipc://` in a private directory. False is `--insecure-bus`.
   */
  curve?: boolean;
  maxFrameBytes?: number;
  /** How long after `room.abort_requested` the room is marked aborted even without both releases. Default 2000. */
  abortGraceMs?: number;
  /** An engine whose last heartbeat is older than this gets no new rooms. Default 3000. */
  engineFreshMs?: number;
  /** Per-state deadlines for new rooms (defaults in src/journal/states.ts). */
  deadlinesMs?: Partial<StateDeadlinesMs>;
  /**
   * Migrations per request: when an engine dies under a live client, its rooms continue on a
   * healthy pair this many times; the next loss fails the request (`migration_limit_reached`).
   * Default 2; 0 turns migration off (the engine's replacement fails its rooms, `engine_restarted`).
   */
  migrationLimit?: number;
  /** How long a migrating request waits for a healthy pair. Default 15000 ms. */
  migrationWaitMs?: number;
  /**
   * The journal has refused writes for this long: every request in flight is answered now (503,
   * or an error event on a stream) instead of waiting out the outage, and its room is failed
   * (`journal_unavailable`) once the journal takes writes again. Default 1000 ms.
   */
  journalOutageGraceMs?: number;
  /** Tokenizer for prompt sizes; must match the engines' model. Default: the built-in model. */
  model?: ModelInfo;
  log: Logger;
  version: string;
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
  /** The HTTP request's id and W3C traceparent, journaled on `room.created` (and its migrations'). */
  requestId?: string;
  traceparent?: string;
}

/** Ended rooms whose engines are remembered after they leave `rooms`. */
const ENDED_ROOMS_KEPT = 50_000;
/** An engine silent this long with no live rooms leaves the registry. */
export const ENGINE_EXPIRY_MS = 600_000;

/** The longest prompt, in UTF-8 bytes: what fits in a `room.created` event on the bus. */
export const MAX_PROMPT_BYTES = maxRequestTextBytes();

/** Most tokens one completion may ask for. */
export const MAX_TOKENS_LIMIT = 100_000;

export class ControlPlane {
  readonly registry = new EngineRegistry();
  /** Live rooms (and terminal ones until both engines released), folded from committed events. */
  readonly rooms = new Map<string, Room>();
  /** The engines of rooms that ended and left `rooms`, newest last (bounded): late events from them are still theirs. */
  private readonly ended = new Map<string, { prefillEngine: string; decodeEngine: string }>();
  private expiry: NodeJS.Timeout | null = null;
  private outageTimer: NodeJS.Timeout | null = null;
  /** Answers clients while the journal refuses writes, and fails their rooms once it takes them. */
  private readonly outage: JournalOutage;
  private readonly streams = new Map<string, RoomStream>();
  private readonly requests = new Map<string, RoomRequest>();
  private readonly aborts: Aborts;
  /**
   * Rooms with engine appends on their way to a commit: the room as those appends leave it, so
   * that the next one from the same engine is judged after them, not before.
   */
  private readonly inFlight = new Map<string, { room: Room; appends: number }>();
  /** Pairs whose KV could not move lately, passed over for a while (pairs.ts). */
  private readonly pairHealth = new PairHealth();
  private readonly pairAvoided = (prefill: string, decode: string) =>
    this.pairHealth.avoid(prefill, decode);
  private subscription: Subscription | null = null;
  private readonly model: ModelInfo;
  private closing: Promise<void> | null = null;
  bus!: BusServer;
  /** Rooms the previous control plane left in flight, failed at this start (`orphaned_by_restart`). */
  orphansFailed = 0;
  private readonly link: EngineLink;
  private readonly migrator: Migrator;
  /** When this process's own loop was last blocked: stall evidence counts only after it. */
  readonly loopLag = new LoopLag();
  /** KV pages promised to rooms per engine: admission counts pages, not rooms. */
  readonly pages = new PageLedger((engine) => this.registry.get(engine));
  /** Engines heartbeating within this many ms get new rooms (`engineFreshMs`, default 3000). */
  /** An engine whose last heartbeat is older than this gets no new rooms. */
  readonly freshMs: number;
  private readonly roomListeners: Array<
    (before: Room | null, after: Room, ev: JournalEvent) => void
  > = [];
  readonly counters: ControlCounters = {
    appends: 0,
    nacks: 0,
    tokens: 0,
    tokensDropped: 0,
    delivered: 0,
    hellos: 0,
  };

  private constructor(
    readonly journal: JournalStore,
    private readonly options: ControlPlaneOptions,
  ) {
    this.model = options.model ?? new DeterministicModel();
    this.freshMs = options.engineFreshMs ?? 3000;
    this.outage = new JournalOutage({
      journal,
      streaming: () => this.streams.keys(),
      endStream: (room, reason) => this.endUnrecorded(room, reason),
      roomNow: (room) => this.rooms.get(room),
      graceMs: options.journalOutageGraceMs ?? 1000,
    });
    this.aborts = new Aborts(
      journal,
      (room) => this.rooms.get(room),
      options.log,
      options.abortGraceMs,
    );
    this.link = new EngineLink({
      journal,
      registry: this.registry,
      modelFormat: this.model.format,
      counters: this.counters,
      log: options.log,
      admission: options.admission,
      roomOwners: (room) => this.rooms.get(room) ?? this.ended.get(room),
      wouldReject: (event, engine) => {
        const ahead = this.inFlight.get(event.room);
        const view = ahead?.room ?? this.rooms.get(event.room);
        if (!view) return true;
        const ev = { ...event, seq: 0, ts: Date.now(), engine } as Parameters<typeof reduce>[1];
        const r = reduce(view, ev);
        if (!r.ok) return true;
        this.inFlight.set(event.room, { room: r.room, appends: (ahead?.appends ?? 0) + 1 });
        return false;
      },
      settled: (room) => {
        const ahead = this.inFlight.get(room);
        if (ahead && --ahead.appends <= 0) this.inFlight.delete(room);
      },
      request: (room) => this.requests.get(room),
      timed: (p) => this.timed(p),
      replaced: (engine, old) => this.engineLost(engine, old, 'it came back as a new incarnation'),
    });
    this.migrator = new Migrator(
      {
        journal,
        registry: this.registry,
        model: this.model,
        log: options.log,
        rooms: this.rooms,
        streams: this.streams,
        requests: this.requests,
        closing: () => this.closing !== null,
        createRoom: (...args) => this.createRoom(...args),
        canHold: (s, promptTokens, maxTokens) =>
          this.pages.fits(s, this.pages.pagesFor(s, promptTokens, maxTokens)),
        pairAvoided: this.pairAvoided,
      },
      {
        limit: options.migrationLimit ?? 2,
        waitMs: options.migrationWaitMs ?? 15_000,
        engineFreshMs: this.freshMs,
      },
    );
  }

  static async start(options: ControlPlaneOptions): Promise<ControlPlane> {
    const { journal } = options;
    const cp = new ControlPlane(journal, options);
    try {
      await cp.loadLiveRooms();
      cp.subscription = journal.subscribe(await journal.headSeq(), (ev) => cp.onCommitted(ev));
      cp.orphansFailed = await cp.failOrphans();
      const endpoint = options.bus ?? 'tcp://127.0.0.1:0';
      const { server } = options.admission;
      cp.bus = await BusServer.bind(
        {
          endpoint,
          curve:
            (options.curve ?? needsCurve(endpoint))
              ? { ...server, allow: (key) => options.admission.knows(key) }
              : undefined,
          maxFrameBytes: options.maxFrameBytes,
          log: options.log,
        },
        cp.handlers(),
      );
      cp.link.bus = cp.bus;
      cp.expiry = setInterval(() => cp.expireEngines(), 60_000);
      cp.expiry.unref();
      cp.outageTimer = setInterval(() => cp.outage.tick(), 250);
      cp.outageTimer.unref();
      cp.loopLag.start();
    } catch (err) {
      cp.subscription?.close();
      await journal.drain();
      throw err;
    }
    options.log.info({ bus: cp.bus.endpoint }, 'control plane ready');
    return cp;
  }

  get endpoint(): string {
    return this.bus.endpoint;
  }

  // ── what the API, recovery and drills read (nothing else of the control plane is theirs) ──

  /** Every engine it knows, as registered (identity, last heartbeat, load). */
  engines(): readonly EngineSession[] {
    return this.registry.all();
  }

  /** One engine's session; undefined when it is not registered. */
  engine(id: string): EngineSession | undefined {
    return this.registry.get(id);
  }

  /** Rooms in flight, and ended ones until both engines have released them. */
  liveRooms(): IterableIterator<Room> {
    return this.rooms.values();
  }

  /** One room as the control plane has folded it; undefined once it has left the view. */
  room(id: string): Room | undefined {
    return this.rooms.get(id);
  }

  /** Whether the journal takes writes now, and why not. */
  journalHealth(): JournalHealth {
    return this.journal.health();
  }

  /** The bus as operators see it: endpoint, receive loop, frames dropped by reason, outbox. */
  busStatus(): {
    endpoint: string;
    loop: { ticks: number; restarts: number; running: boolean };
    dropped: Partial<Record<DropReason, number>>;
    outbox: number;
    zapDenied: number;
  } {
    return {
      endpoint: this.bus.endpoint,
      loop: this.bus.loop.stats(),
      dropped: this.bus.drops.snapshot(),
      outbox: this.bus.outboxDepth,
      zapDenied: this.bus.zapDenied,
    };
  }

  /** The model id clients ask for (`GET /v1/models`). */
  get modelName(): string {
    return this.model.name;
  }

  /** The model's tokenizer, chat template and limits (requests are shaped with it). */
  get modelInfo(): ModelInfo {
    return this.model;
  }

  private async loadLiveRooms(): Promise<void> {
    let cursor: string | undefined;
    do {
      const page = await this.journal.rooms({ state: [...LIVE_STATES], limit: 10_000, cursor });
      for (const r of page.rooms) this.rooms.set(r.room, r);
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
  }

  /**
   * Startup replay: rooms the journal shows in flight belonged to a control plane that died with
   * their clients' connections. They are failed (`orphaned_by_restart`, in the stage they were
   * in); engines that survived free their pages when the failure reaches them.
   */
  private async failOrphans(): Promise<number> {
    const orphans = [...this.rooms.values()];
    await Promise.all(
      orphans.map((r) =>
        this.journal
          .append({
            type: 'room.failed',
            room: r.room,
            source: 'control',
            eventId: `${r.room}:orphaned`,
            data: { reason: 'orphaned_by_restart', stage: r.state, detectedBy: 'control' },
          })
          .catch((err) =>
            this.options.log.error({ err, room: r.room }, 'could not fail an orphaned room'),
          ),
      ),
    );
    if (orphans.length > 0) {
      this.options.log.warn(
        { rooms: orphans.length },
        'failed rooms left in flight by the previous control plane',
      );
      await this.journal.append({
        type: 'recovery.action',
        source: 'control',
        data: {
          action: 'fail_orphaned_rooms',
          reason: 'control plane restarted',
          outcome: `${orphans.length} rooms failed`,
        },
      });
    }
    return orphans.length;
  }

  private handlers(): BusServerHandlers {
    return {
      hello: (peer, msg) => void this.link.hello(peer, msg),
      heartbeat: (_peer, engine, msg) => {
        const s = this.registry.get(engine);
        if (s) recordHeartbeat(s, msg);
      },
      append: (peer, engine, msg) => this.link.append(peer, engine, msg),
      tokens: (_peer, engine, msg) => this.onTokens(engine, msg),
      throttled: (_peer, engine, kind, quotas) => this.link.throttled(engine, kind, quotas),
      fenced: (peer) => this.link.fencedPeer(peer),
    };
  }

  /**
   * Tokens reach a client only from the engine the committed journal made its room's decode
   * engine, once the KV is there (`transferred`: the decode engine starts before its
   * `decode_started` commits) and before the room ends. Anything else — a room not yet created,
   * another engine's room, one whose id was guessed — is refused and counted (`not_owner`).
   */
  private onTokens(engine: string, msg: EngineMessage<'tokens'>): void {
    const stream = this.streams.get(msg.room);
    const view = this.rooms.get(msg.room);
    if (
      !view ||
      view.decodeEngine !== engine ||
      (view.state !== 'transferred' && view.state !== 'decoding')
    ) {
      this.counters.tokensDropped++;
      this.bus.drops.record('not_owner', {
        engine,
        room: msg.room,
        kind: 'tokens',
        state: view?.state ?? null,
      });
      return;
    }
    if (!stream) {
      this.counters.tokensDropped++;
      this.bus.drops.record('unknown_room', { engine, room: msg.room, kind: 'tokens' });
      return;
    }
    const s = this.registry.get(engine);
    if (s) recordProgress(s);
    if (stream.push(msg)) this.counters.tokens += msg.tokens;
    else {
      this.counters.tokensDropped++;
      this.bus.drops.record('duplicate', {
        engine,
        room: msg.room,
        kind: 'tokens',
        index: msg.index,
      });
    }
  }

  // ── committed events ─────────────────────────────────────────────────────────────────────

  private onCommitted(ev: JournalEvent): void {
    if (ev.room === null || ev.type === 'room.event_rejected') return;
    const before = this.rooms.get(ev.room) ?? null;
    const r = reduce(before, ev);
    if (!r.ok) return;
    const room = r.room;
    this.rooms.set(ev.room, room);
    if (ev.engine !== null && room.state !== before?.state) {
      const s = this.registry.get(ev.engine);
      if (s) recordProgress(s);
    }
    this.link.deliver(room, ev);
    for (const l of this.roomListeners) {
      try {
        l(before, room, ev);
      } catch (err) {
        this.options.log.error({ err, room: room.room }, 'room listener threw');
      }
    }
    if (ev.type === 'room.released' && ev.engine !== null) this.pages.release(room.room, ev.engine);
    if (ev.type === 'room.transfer_completed')
      this.pairHealth.moved(room.prefillEngine, room.decodeEngine);
    else if (ev.type === 'room.failed' && isTransportFailure(room.reason))
      this.pairHealth.failed(room.prefillEngine, room.decodeEngine, ev.ts);
    this.aborts.onCommitted(room, ev);
    if (isTerminal(room.state) && (!before || !isTerminal(before.state))) this.onTerminal(room);
    if (isTerminal(room.state) && releasedByBoth(room)) {
      this.rooms.delete(room.room);
      this.pages.releaseAll(room.room);
      this.ended.set(room.room, {
        prefillEngine: room.prefillEngine,
        decodeEngine: room.decodeEngine,
      });
      if (this.ended.size > ENDED_ROOMS_KEPT) {
        const oldest = this.ended.keys().next().value;
        if (oldest !== undefined) this.ended.delete(oldest);
      }
    }
  }

  /** Drops an engine from the registry and the bus (it must say hello again to come back). */
  forgetEngine(engine: string): void {
    const s = this.registry.get(engine);
    if (!s) return;
    this.registry.delete(engine);
    this.bus.unregister(s.peer);
  }

  /**
   * Forgets engines that have been silent for `ENGINE_EXPIRY_MS` and hold no live room, so that
   * the registry cannot grow without bound with engines that came and went.
   */
  expireEngines(now = Date.now()): string[] {
    const gone: string[] = [];
    for (const s of this.registry.all()) {
      if (now - s.health.lastSeen < ENGINE_EXPIRY_MS || s.load.liveRooms > 0) continue;
      this.forgetEngine(s.engine);
      gone.push(s.engine);
    }
    if (gone.length > 0)
      this.options.log.info({ engines: gone }, 'forgot engines silent for 10 min with no rooms');
    return gone;
  }

  /** Called for every committed room event the control plane folds (metrics, canaries). */
  onRoomEvent(listener: (before: Room | null, after: Room, ev: JournalEvent) => void): () => void {
    this.roomListeners.push(listener);
    return () => {
      const i = this.roomListeners.indexOf(listener);
      if (i >= 0) this.roomListeners.splice(i, 1);
    };
  }

  private timed<T>(p: Promise<T>): Promise<T> {
    const t0 = performance.now();
    return p.then((v) => {
      const ms = performance.now() - t0;
      for (const l of this.appendListeners) l(ms);
      return v;
    });
  }

  private readonly appendListeners: Array<(ms: number) => void> = [];

  /** Called with the append-to-commit time of every control-plane append (metrics). */
  onAppendCommitted(listener: (ms: number) => void): void {
    this.appendListeners.push(listener);
  }

  private onTerminal(room: Room): void {
    this.aborts.onTerminal(room.room);
    this.requests.delete(room.room);
    for (const engine of new Set([room.prefillEngine, room.decodeEngine])) {
      const s = this.registry.get(engine);
      if (s && s.load.liveRooms > 0) s.load.liveRooms--;
    }
    const stream = this.streams.get(room.room);
    if (!stream) return;
    this.streams.delete(room.room);
    if (room.state === 'completed' && stream.currentTokens !== room.tokens) {
      // Cannot happen if engines follow the protocol (chunks precede the completion on one
      // connection); if it does, the client must not get a silently shortened answer.
      this.options.log.error(
        {
          room: room.room,
          engine: room.decodeEngine,
          streamed: stream.currentTokens,
          completed: room.tokens,
        },
        'room completed with tokens missing from its stream',
      );
      stream.fail(
        new RoomEndedError(
          room.room,
          'unavailable',
          `stream is missing ${(room.tokens ?? 0) - stream.currentTokens} tokens`,
        ),
      );
    } else if (room.state === 'completed') stream.complete(room.finishReason ?? 'length');
    else
      stream.fail(
        new RoomEndedError(
          room.room,
          room.state as 'aborted' | 'failed' | 'migrated',
          room.reason ?? (room.state === 'migrated' ? `migrated to ${room.migratedTo}` : 'unknown'),
          room.failedStage,
        ),
      );
  }

  // ── requests ─────────────────────────────────────────────────────────────────────────────

  /**
   * Creates a room for the request on the engine pair of lowest cost (control/pairs.ts) and returns its token stream.
   * Throws a ControlError (CONTROL_BAD_REQUEST, CONTROL_NO_ENGINES, CONTROL_CLOSED) when it
   * cannot; a journal that refuses the write fails the stream with CONTROL_JOURNAL_UNAVAILABLE.
   */
  submit(request: SubmitRequest): RoomStream {
    if (this.closing)
      throw new ControlError('CONTROL_CLOSED', 'the control plane is shutting down');
    const { prompt, maxTokens } = request;
    const stop = request.stop ?? [];
    if (
      !Array.isArray(stop) ||
      stop.length > 4 ||
      stop.some((s) => typeof s !== 'string' || s.length === 0 || s.length > 200)
    ) {
      throw new ControlError(
        'CONTROL_BAD_REQUEST',
        'stop must be at most 4 strings of 1 to 200 characters',
      );
    }
    if (typeof prompt !== 'string' || prompt.length === 0) {
      throw new ControlError('CONTROL_BAD_REQUEST', 'prompt must be a non-empty string');
    }
    if (!Number.isInteger(maxTokens) || maxTokens < 1 || maxTokens > MAX_TOKENS_LIMIT) {
      throw new ControlError(
        'CONTROL_BAD_REQUEST',
        `max tokens must be an integer from 1 to ${MAX_TOKENS_LIMIT}, got ${maxTokens}`,
      );
    }
    const tokens = request.tokens ?? this.model.tokenize(prompt);
    const promptTokens = tokens.length;
    if (promptTokens === 0) throw new ControlError('CONTROL_BAD_REQUEST', 'prompt has no tokens');
    // The prompt travels to the prefill engine inside its room.created event: one that cannot fit
    // in a bus frame would never arrive, and is refused before anything is journaled.
    const sent = this.model.sendsTokens ? { prompt, tokens } : { prompt };
    const bytes = requestTextBytes(sent);
    if (bytes > MAX_PROMPT_BYTES) {
      throw new ControlError(
        'CONTROL_BAD_REQUEST',
        `prompt is ${bytes} bytes (UTF-8${this.model.sendsTokens ? ', and 5 per token id' : ''}); the most an engine can be sent is ${MAX_PROMPT_BYTES} bytes (the bus frame limit of ${DEFAULT_MAX_FRAME_BYTES} bytes less the event around it)`,
      );
    }
    const context = this.model.contextSize;
    if (context !== null && promptTokens + maxTokens > context) {
      throw new ControlError(
        'CONTROL_CONTEXT_LENGTH_EXCEEDED',
        `this model's context is ${context} tokens; the prompt has ${promptTokens} and max_tokens asks for ${maxTokens} more (${promptTokens + maxTokens}); shorten the prompt or ask for at most ${Math.max(0, context - promptTokens)} tokens`,
      );
    }
    const pair = this.pickPair(promptTokens, maxTokens);
    const room = newRoomId();
    const stream = new RoomStream(room, promptTokens, Date.now());
    stream.trace = {
      ...(request.requestId ? { requestId: request.requestId } : {}),
      ...(request.traceparent ? { traceparent: request.traceparent } : {}),
    };
    const req: RoomRequest = {
      ...sent,
      maxTokens,
      ...(stop.length > 0 ? { stop } : {}),
      ...(request.sampling ? { sampling: request.sampling } : {}),
    };
    this.createRoom(stream, room, req, promptTokens, pair, {
      source: request.source ?? 'api',
    });
    const signal = request.signal;
    if (signal) {
      // The room serving the request when the client leaves: after a migration, not the first.
      const onAbort = () => {
        stream.cancelled = true;
        void this.abort(stream.current, 'client_disconnect', 'client').catch(() => {});
      };
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
      void stream.result
        .finally(() => signal.removeEventListener('abort', onAbort))
        .catch(() => {});
    }
    return stream;
  }

  /**
   * The pair for a new room (control/pairs.ts): fresh engines with the KV pages for `tokens` free
   * now, of lowest cost. Throws CONTROL_NO_ENGINES when a role has no fresh engine or no pair can
   * move KV, CONTROL_BAD_REQUEST when no engine could ever hold the request, CONTROL_OVERLOADED
   * (429) when one could but none can now.
   */
  private pickPair(promptTokens: number, maxTokens: number): Pair {
    const now = Date.now();
    const fits = (s: EngineSession) =>
      this.pages.fits(s, this.pages.pagesFor(s, promptTokens, maxTokens));
    const prefills = this.registry.candidates('prefill', this.freshMs, now, fits);
    const decodes = this.registry.candidates('decode', this.freshMs, now, fits);
    const pair = choosePair(prefills, decodes, this.pairAvoided);
    if (pair) return pair;
    if (prefills.length === 0) this.noneFor('prefill', promptTokens, maxTokens, now);
    if (decodes.length === 0) this.noneFor('decode', promptTokens, maxTokens, now);
    throw new ControlError('CONTROL_NO_ENGINES', unreachable(prefills, decodes));
  }

  /** Why no engine of the role can take the request (pickPair's refusals). */
  private noneFor(
    role: 'prefill' | 'decode',
    promptTokens: number,
    maxTokens: number,
    now: number,
  ): never {
    const freshMs = this.freshMs;
    const need = (s: EngineSession) => this.pages.pagesFor(s, promptTokens, maxTokens);
    const fresh = this.registry.fresh(role, freshMs, now);
    if (fresh.length === 0) {
      const draining = this.registry.draining(role, freshMs, now).map((s) => s.engine);
      if (draining.length > 0)
        throw new ControlError(
          'CONTROL_ENGINES_DRAINING',
          `every ${role} engine is draining (${draining.join(', ')}): none takes new rooms; \`pdctl engines undrain ${draining[0]}\` takes one back`,
        );
      throw new ControlError(
        'CONTROL_NO_ENGINES',
        `no ${role} engine is registered with a heartbeat in the last ${freshMs} ms`,
      );
    }
    const largest = fresh.reduce((a, b) => (b.pages > a.pages ? b : a));
    const tokens = this.pages.tokensFor(largest, promptTokens, maxTokens);
    const what =
      tokens > promptTokens
        ? `${tokens} tokens of KV (prompt ${promptTokens} + max_tokens ${maxTokens})`
        : `${tokens} prompt tokens of KV`;
    if (!fresh.some((s) => this.pages.couldEverFit(s, need(s)))) {
      throw new ControlError(
        'CONTROL_BAD_REQUEST',
        `the request needs ${what}, ${need(largest)} pages, but the largest ${role} KV pool has ${largest.pages} pages; ask for fewer max_tokens or a shorter prompt`,
      );
    }
    const free = Math.max(...fresh.map((s) => s.pages - s.load.reservedPages));
    throw new ControlError(
      'CONTROL_OVERLOADED',
      `no ${role} engine has the KV pages for ${what} free now (most free: ${free} of ${largest.pages} pages); retry shortly`,
    );
  }

  /** Journals `room.created` for the stream's request on the pair; the stream fails if refused. */
  private createRoom(
    stream: RoomStream,
    room: string,
    request: RoomRequest,
    promptTokens: number,
    { prefill, decode, transport }: Pair,
    o: { source: string; migratedFrom?: string },
  ): void {
    this.streams.set(room, stream);
    this.requests.set(room, request);
    prefill.load.liveRooms++;
    decode.load.liveRooms++;
    this.pages.hold(room, prefill, this.pages.pagesFor(prefill, promptTokens, request.maxTokens));
    this.pages.hold(room, decode, this.pages.pagesFor(decode, promptTokens, request.maxTokens));
    this.timed(
      this.journal.append({
        type: 'room.created',
        room,
        source: o.source,
        data: {
          prefillEngine: prefill.engine,
          decodeEngine: decode.engine,
          promptTokens,
          maxTokens: request.maxTokens,
          model: this.model.name,
          transport,
          ...(request.sampling ? { sampling: request.sampling } : {}),
          ...stream.trace,
          ...(o.migratedFrom ? { migratedFrom: o.migratedFrom } : {}),
          ...(this.options.deadlinesMs ? { deadlinesMs: this.options.deadlinesMs } : {}),
        },
      }),
    ).then(
      (res) => {
        if (res.status === 'applied') stream.markAdmitted();
        else
          this.abandon(
            room,
            prefill,
            decode,
            new ControlError('CONTROL_JOURNAL_UNAVAILABLE', `room.created was ${res.status}`),
          );
      },
      (err) =>
        this.abandon(
          room,
          prefill,
          decode,
          new ControlError(
            'CONTROL_JOURNAL_UNAVAILABLE',
            `the journal refused the room: ${(err as Error).message}`,
            { cause: err },
          ),
        ),
    );
  }

  // ── migration (migration.ts) ─────────────────────────────────────────────────────────────

  /**
   * An engine's process is gone (it exited, or came back as a new incarnation): its live rooms
   * whose clients still read continue on a healthy pair, unbroken (see migration.ts). Resolves
   * once the migrations are journaled.
   */
  engineLost(engine: string, incarnation: string, reason: string): Promise<void> {
    // Least loaded once its rooms have moved, a dead engine would otherwise be picked first for
    // every new room until its heartbeat went stale (seconds), each such room to be moved again.
    this.link.gone(engine, incarnation);
    return this.migrator.engineLost(engine, incarnation, reason);
  }

  /**
   * Declares the engine's incarnation lost though its process may still run — silent past the
   * limit, partitioned from this control plane or hung (the escalation ladder decides): its live
   * rooms continue on healthy pairs as for a dead engine, and nothing from that incarnation is
   * applied any more (engine-link.ts `fence`); it is told BUS_FENCED when it is heard from, exits,
   * and rejoins as a new incarnation. False when that incarnation is no longer the registered one.
   */
  fence(engine: string, incarnation: string, reason: string): boolean {
    if (!this.link.fence(engine, incarnation, reason)) return false;
    this.options.log.error({ engine, incarnation, reason }, 'engine fenced: its rooms move');
    void this.migrator.engineLost(engine, incarnation, reason);
    return true;
  }

  private abandon(room: string, prefill: EngineSession, decode: EngineSession, err: Error): void {
    prefill.load.liveRooms = Math.max(0, prefill.load.liveRooms - 1);
    decode.load.liveRooms = Math.max(0, decode.load.liveRooms - 1);
    this.pages.releaseAll(room);
    this.requests.delete(room);
    this.streams.get(room)?.fail(err);
    this.streams.delete(room);
  }

  /**
   * Ends the client's stream of a room whose end the journal cannot record now (it refuses
   * writes): the client gets an answer within the room's deadline instead of waiting out the
   * outage. The room itself ends in the journal once it accepts writes again (the watchdog keeps
   * trying). False when no client is reading the room.
   */
  endUnrecorded(room: string, reason: string): boolean {
    const stream = this.streams.get(room);
    if (!stream) return false;
    this.streams.delete(room);
    stream.fail(new RoomEndedError(room, 'unavailable', reason));
    return true;
  }

  /** Appends the AbortReq; engines stop and release, then the room is marked aborted (aborts.ts). */
  abort(room: string, reason: string, source = 'api'): Promise<AppendResult> {
    return this.aborts.request(room, reason, source);
  }

  /**
   * Sends a command to an engine (abort or free a room, reset its transfer endpoint, drain,
   * shut down). False when the engine is not connected.
   */
  command(
    engine: string,
    command: CommandName,
    room: string | null = null,
    reason: string | null = null,
  ): boolean {
    const s = this.registry.get(engine);
    if (!s?.delivery.live) return false;
    this.options.log.info({ engine, command, room, reason }, 'command sent');
    this.bus.send(s.peer, 'command', { command, room, reason });
    return true;
  }

  /**
   * Engines that stopped working while alive, why, and since when (stalls.ts: a bus loop that
   * consumes nothing — the wedge of docs/incident.md —, a frozen transfer core or work loop, rooms
   * piling up on it, canaries failing on it). Used by the escalation ladder and `/health/ready`.
   */
  stalledEngines(policy: StallPolicy = DEFAULT_STALL_POLICY, now = Date.now()): Stall[] {
    return findStalls(this.registry.all(), this.rooms.values(), policy, now, {
      journalWritable: this.journal.health().writable,
      lateAt: this.loopLag.lateAt,
    });
  }

  /**
   * A canary's verdict, for the engines its room ran on: a failure counts against the engine that
   * owns the stage it stopped in (bootstrap and decode: the decode engine; prefill and transfer:
   * the prefill engine); a success clears both. A journal that cannot be written is nobody's
   * engine's fault, and counts against none.
   */
  noteCanary(
    room: { prefillEngine: string; decodeEngine: string } | null,
    ok: boolean,
    stage: string | null,
    reason: string | null,
  ): void {
    if (!room) return;
    if (ok) {
      for (const id of [room.prefillEngine, room.decodeEngine]) {
        const s = this.registry.get(id);
        if (s) recordCanaryPassed(s);
      }
      return;
    }
    if (!this.journal.health().writable) return;
    // A full pool is load, not a broken engine: it never counts toward a stall.
    if (reason?.includes('kv_pool_full')) return;
    const owner =
      stage === 'prefill' || stage === 'transfer'
        ? room.prefillEngine
        : stage === 'bootstrap' || stage === 'decode'
          ? room.decodeEngine
          : null;
    const s = owner === null ? undefined : this.registry.get(owner);
    if (!s) return;
    recordCanaryFailed(s, `${stage}: ${reason ?? 'unknown'}`);
  }

  /** Resolves once `prefill` and `decode` engines are registered and live. */
  async waitForEngines(prefill: number, decode: number, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const live = this.registry.all().filter((s) => s.delivery.live);
      const p = live.filter((s) => s.role === 'prefill').length;
      const d = live.filter((s) => s.role === 'decode').length;
      if (p >= prefill && d >= decode) return;
      if (Date.now() > deadline) {
        throw new ControlError(
          'CONTROL_ENGINES_TIMEOUT',
          `only ${p}/${prefill} prefill and ${d}/${decode} decode engines registered within ${timeoutMs} ms; check the engines' logs above`,
        );
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /** Fails every open stream, stops the bus and drains the journal. Idempotent. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      if (this.expiry) clearInterval(this.expiry);
      if (this.outageTimer) clearInterval(this.outageTimer);
      this.loopLag.stop();
      this.aborts.close();
      for (const s of this.streams.values()) {
        s.fail(new RoomEndedError(s.room, 'unavailable', 'control plane shutting down'));
      }
      this.streams.clear();
      this.subscription?.close();
      await this.bus.close();
      await this.journal.drain();
    })();
    return this.closing;
  }
}
