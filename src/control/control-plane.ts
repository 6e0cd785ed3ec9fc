/**
 * The control plane: wiring and orchestration of the parts in src/control/ — the room book
 * (rooms/room-book.ts), intake (intake/), the engine links (engines/), migration, aborts, the
 * journal-outage answerer and recovery's evidence (evidence/). The book folds every committed
 * event, and the commit stages (commit-stages.ts) hand it on in their declared order; it relays
 * token chunks to the client streams, and shows engines as frozen views (engines/engine-view.ts)
 * with one liveness rule. The composition root (src/app/) starts it here.
 */

import type { CommandName } from '../bus/protocol.ts';
import type { BusServer, BusServerHandlers, BusStatus } from '../bus/server.ts';
import type { AppendResult, JournalHealth, JournalStore, Subscription } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { DeterministicModel } from '../model/deterministic.ts';
import type { ModelInfo } from '../model/executor.ts';
import { type Clock, stepTimer, systemClock, type Timer } from '../ports/clock.ts';
import { systemIds } from '../ports/ids.ts';
import type { JournalEvent } from '../room/events.ts';
import type { Room } from '../room/reducer.ts';
import { TenantBook } from '../tenants/book.ts';
import { type ControlCounters, openBus, zeroCounters } from './bus.ts';
import { Checkpointer } from './checkpoint/checkpointer.ts';
import { emptyStartup, replayJournal, type Startup } from './checkpoint/replay.ts';
import { type CommitStageBodies, commitStages, runCommitStages } from './commit-stages.ts';
import { AppendRelay, type RefusedClaim } from './engines/appends.ts';
import { EngineLink } from './engines/engine-link.ts';
import {
  DEFAULT_LIVENESS,
  type EngineView,
  type LivenessPolicy,
  viewsOf,
} from './engines/engine-view.ts';
import { EngineRegistry } from './engines/registry.ts';
import { ControlError } from './errors.ts';
import { type CanaryVerdict, recordCanary, recordHeartbeat } from './evidence/engine-health.ts';
import { LoopLag } from './evidence/loop-lag.ts';
import { DEFAULT_STALL_POLICY, findStalls, type Stall } from './evidence/stalls.ts';
import { Aborts } from './intake/aborts.ts';
import { Intake } from './intake/intake.ts';
import { PairHealth } from './intake/pairs.ts';
import { RoomEndedError, type RoomStream } from './intake/streams.ts';
import { relayTokens } from './intake/tokens.ts';
import { Listeners, timing } from './listeners.ts';
import {
  CONTROL_DEFAULTS,
  type ControlDefaults,
  type ControlPlaneOptions,
  type SubmitRequest,
} from './options.ts';
import { JournalOutage } from './rooms/journal-outage.ts';
import { Migrator } from './rooms/migration.ts';
import { failOrphans } from './rooms/orphans.ts';
import { RoomBook, type RoomOwners } from './rooms/room-book.ts';
import { Router } from './routing/router.ts';
import { loadTenants } from './tenants.ts';

type Resolved = ControlDefaults & ControlPlaneOptions;
type RoomListener = (before: Room | null, after: Room, ev: JournalEvent) => void;

export class ControlPlane {
  readonly registry: EngineRegistry;
  readonly book: RoomBook;
  readonly counters: ControlCounters = zeroCounters();
  /** When this process's own loop was last blocked: stall evidence counts only after it. */
  readonly loopLag: LoopLag;
  /** Time and timers of the control plane and of what watches it (ports/clock.ts). */
  readonly clock: Clock;
  /** When an engine is live, stale or stalled: one policy for readiness, routing and the ladder. */
  readonly liveness: Readonly<LivenessPolicy>;
  readonly bus: BusServer;
  /** Chooses each new room's pair, by the prefix index folded from the journal. */
  readonly router: Router;
  /** Who may call the serving API, folded from the journal's `tenant.*` events (src/tenants/). */
  readonly tenants = new TenantBook();
  /** Rooms left in flight, failed now; each rebuild step's ms; the checkpoint it began from. */
  startup: Startup = emptyStartup;
  private readonly options: Resolved;
  private readonly model: ModelInfo;
  private readonly log: Logger;
  /** Pairs whose KV could not move lately, passed over for a while (pairs.ts). */
  private readonly pairHealth: PairHealth;
  private readonly link: EngineLink;
  private readonly appends: AppendRelay;
  private readonly intake: Intake;
  private readonly migrator: Migrator;
  private readonly aborts: Aborts;
  /** Answers clients while the journal refuses writes, and fails their rooms once it takes them. */
  private readonly outage: JournalOutage;
  private readonly roomEvents: Listeners<Parameters<RoomListener>>;
  private readonly appendTimes: Listeners<[ms: number]>;
  private readonly timers: Timer[] = [];
  /** What each commit stage does here (commit-stages.ts). */
  private readonly stages: CommitStageBodies;
  private subscription: Subscription | null = null;
  private checkpoints: Checkpointer | null = null;
  private closing: Promise<void> | null = null;

  private constructor(
    readonly journal: JournalStore,
    options: ControlPlaneOptions,
  ) {
    const o = { ...CONTROL_DEFAULTS, ...options } as Resolved;
    const { clock = systemClock, ids = systemIds } = o;
    this.clock = clock;
    this.registry = new EngineRegistry(clock);
    this.book = new RoomBook((engine) => this.registry.get(engine), clock);
    this.loopLag = new LoopLag(clock);
    this.pairHealth = new PairHealth(o.pairAvoidMs, o.pairAvoidMaxMs);
    this.options = o;
    this.log = o.log;
    this.model = o.model ?? new DeterministicModel();
    this.roomEvents = new Listeners(o.log, 'room listener');
    this.appendTimes = new Listeners(o.log, 'append listener');
    this.liveness = Object.freeze({ ...DEFAULT_LIVENESS, ...o.liveness });
    this.bus = openBus(o, clock);
    const timed = timing(this.appendTimes, clock);
    const { router: policy, kvBlockTokens: blockTokens, routerOverlapWeight: overlapWeight } = o;
    this.router = new Router({ policy, blockTokens, overlapWeight });
    const { registry, book, counters, bus, router } = this;
    this.outage = new JournalOutage({
      journal,
      streaming: () => book.streaming(),
      endStream: (room, reason) => this.endUnrecorded(room, reason),
      roomNow: (room) => book.room(room),
      graceMs: o.journalOutageGraceMs,
    });
    this.aborts = new Aborts(journal, (room) => book.room(room), o.log, o.abortGraceMs, clock);
    const common = {
      journal,
      bus,
      registry,
      counters,
      book,
      router,
      timed,
      clock,
      ids,
      log: o.log,
    };
    this.link = new EngineLink({
      ...common,
      modelFormat: this.model.format,
      blockTokens: o.kvBlockTokens,
      admission: o.admission,
      rooms: book,
      replaced: (engine, old) => this.engineLost(engine, old, 'it came back as a new incarnation'),
    });
    this.appends = new AppendRelay(common);
    this.intake = new Intake({
      ...common,
      model: this.model,
      liveness: this.liveness,
      maxRoomsPerEngine: o.maxRoomsPerEngine,
      pairAvoided: (p, d) => this.pairHealth.avoid(p, d, clock.now()),
      pairTaken: (p, d, room) => this.pairHealth.taken(p, d, room, clock.now()),
      ...(o.deadlinesMs ? { deadlinesMs: o.deadlinesMs } : {}),
    });
    const { model, intake } = this;
    const closing = () => this.closing !== null;
    const limits = { limit: o.migrationLimit, waitMs: o.migrationWaitMs, retryLimit: o.retryLimit };
    this.migrator = new Migrator({ ...common, model, intake, closing }, limits);
    const { link, roomEvents, pairHealth, aborts, migrator, log } = this;
    const checkpoints = () => this.checkpoints;
    this.stages = commitStages({
      ...{ tenants: this.tenants, router, checkpoints, registry, clock, link, roomEvents },
      ...{ pairHealth, aborts, migrator, log },
    });
  }

  static async start(options: ControlPlaneOptions): Promise<ControlPlane> {
    const { journal } = options;
    const cp = new ControlPlane(journal, options);
    const { took, time: step } = stepTimer(cp.clock);
    try {
      const into = { book: cp.book, router: cp.router, cordons: cp.registry.cordons, log: cp.log };
      const { head, orphans, restored } = await replayJournal(journal, into, step);
      cp.link.registeredAtStart = new Map(restored.state.registered);
      const deps = { ...into, journal, clock: cp.clock, policy: cp.options };
      cp.checkpoints = new Checkpointer(deps, restored);
      await step('tenantsMs', () => loadTenants(journal, cp.tenants, head));
      cp.subscription = journal.subscribe(head, (ev) => cp.onCommitted(ev));
      const refused = await step('orphansMs', () => failOrphans(journal, orphans, cp.log));
      cp.outage.orphansRefused(refused);
      const { from: checkpoint, folded } = restored;
      cp.startup = { orphansFailed: orphans.length, took, checkpoint, folded };
      await cp.bus.listen(cp.handlers());
      const every = (ms: number, f: () => void) =>
        cp.timers.push(cp.clock.setInterval(f, ms).unref());
      every(cp.options.engineExpiryCheckMs, () => cp.expireEngines());
      every(cp.options.outageCheckMs, () => cp.outage.tick(cp.clock.now()));
      every(1000, () => cp.checkpoints?.tick());
      cp.loopLag.start();
    } catch (err) {
      cp.subscription?.close();
      await cp.bus.close();
      await journal.drain();
      throw err;
    }
    cp.log.info({ bus: cp.bus.endpoint }, 'control plane ready');
    return cp;
  }

  get endpoint(): string {
    return this.bus.endpoint;
  }

  // ── what the API, recovery and drills read (nothing else of the control plane is theirs) ──

  /** Every engine it knows, as frozen views with their status (engine-view.ts). */
  engines(now = this.clock.now(), stalls = this.stalledEngines(undefined, now)): EngineView[] {
    return viewsOf(this.registry, (id) => this.book.liveOn(id), this.liveness, now, stalls);
  }

  /** One engine's view; undefined when it is not registered. */
  engine(id: string, now = this.clock.now()): EngineView | undefined {
    return this.engines(now).find((e) => e.engine === id);
  }

  /** Rooms in flight, and ended ones until both engines have released them. */
  liveRooms(): IterableIterator<Room> {
    return this.book.live();
  }

  /** One room as the control plane has folded it; undefined once it has left the view. */
  room(id: string): Room | undefined {
    return this.book.room(id);
  }

  /** Whether the journal takes writes now, and why not. */
  journalHealth(): JournalHealth {
    return this.journal.health();
  }

  /** The bus as operators see it: endpoint, receive loop, frames dropped by reason, outbox. */
  busStatus(): BusStatus {
    return this.bus.status();
  }

  /** The model: the id clients ask for (`GET /v1/models`), its tokenizer, template and limits. */
  get modelInfo(): ModelInfo {
    return this.model;
  }

  private handlers(): BusServerHandlers {
    return {
      hello: (peer, msg) => void this.link.hello(peer, msg),
      heartbeat: (_peer, engine, msg) => {
        const s = this.registry.get(engine);
        if (s) recordHeartbeat(s, msg, this.clock.now());
      },
      append: (peer, engine, msg) => this.appends.append(peer, engine, msg),
      tokens: (_peer, engine, msg) => relayTokens(this, engine, msg),
      throttled: (_peer, engine, kind, quotas) => this.link.throttled(engine, kind, quotas),
      fenced: (peer) => this.link.fencedPeer(peer),
    };
  }

  /** A committed event: folded into the book, then handed to the engines, listeners and aborts. */
  private onCommitted(ev: JournalEvent): void {
    runCommitStages(this.stages, ev, this.book.fold(ev));
  }

  /** Drops an engine from the registry and the bus (it must say hello again to come back). */
  forgetEngine(engine: string): void {
    this.link.forget(engine);
  }

  /** Forgets engines silent for `engineExpiryMs` that hold no live room (the registry stays bounded). */
  expireEngines(now = this.clock.now()): string[] {
    return this.link.expire(this.options.engineExpiryMs, now);
  }

  /** Called for every committed room event the control plane folds (metrics, canaries). */
  onRoomEvent(listener: RoomListener): () => void {
    return this.roomEvents.add(listener);
  }

  /** Called when an engine's `room.failed` is refused: its role cannot detect that reason. */
  onRefusedClaim(listener: (engine: string, claim: RefusedClaim) => void): () => void {
    return this.appends.refusedClaims.add(listener);
  }

  /** Called with the append-to-commit time of every control-plane append (metrics). */
  onAppendCommitted(listener: (ms: number) => void): () => void {
    return this.appendTimes.add(listener);
  }

  // ── requests ─────────────────────────────────────────────────────────────────────────────

  /**
   * Creates a room for the request on the engine pair of lowest cost and returns its token
   * stream. Throws a ControlError when it cannot (intake.ts says which); a journal that refuses
   * the write fails the stream with CONTROL_JOURNAL_UNAVAILABLE.
   */
  submit(request: SubmitRequest): RoomStream {
    if (this.closing)
      throw new ControlError('CONTROL_CLOSED', 'the control plane is shutting down');
    return this.intake.submit(request, (room) => this.abort(room, 'client_disconnect', 'client'));
  }

  // ── engines lost, fenced, commanded (migration.ts moves their rooms) ──────────────────────

  /**
   * An engine's process is gone (it exited, or came back as a new incarnation): its live rooms
   * whose clients still read continue on a healthy pair, unbroken, once this resolves.
   */
  engineLost(engine: string, incarnation: string, reason: string): Promise<void> {
    // Else, least loaded once its rooms moved, it would get every new room until it went stale.
    this.link.gone(engine, incarnation);
    return this.migrator.engineLost(engine, incarnation, reason);
  }

  /** Retires the engine: no new rooms; its rooms not begun move (migration.ts `moveQueued`). */
  retire(engine: string): Promise<number> {
    this.registry.retiring.add(engine);
    return this.migrator.moveQueued(engine);
  }

  /**
   * Declares the engine's incarnation lost though its process may run (silent, partitioned or
   * hung: the ladder decides): its live rooms move as for a dead engine, and nothing from that
   * incarnation is applied any more (engine-link.ts `fence`). False when that incarnation is no
   * longer the registered one.
   */
  fence(engine: string, incarnation: string, reason: string): boolean {
    if (!this.link.fence(engine, incarnation, reason)) return false;
    this.log.error({ engine, incarnation, reason }, 'engine fenced: its rooms move');
    void this.migrator.engineLost(engine, incarnation, reason);
    return true;
  }

  /**
   * Ends the client's stream of a room whose end the journal cannot record now (it refuses
   * writes), within the room's deadline; the room ends in the journal once it accepts writes
   * again (the watchdog keeps trying). False when no client is reading the room.
   */
  endUnrecorded(room: string, reason: string): boolean {
    const stream = this.book.takeStream(room);
    stream?.fail(new RoomEndedError(room, 'unavailable', reason));
    return stream !== undefined;
  }

  /** Appends the AbortReq; engines stop and release, then the room is marked aborted (aborts.ts). */
  abort(room: string, reason: string, source = 'api'): Promise<AppendResult> {
    return this.aborts.request(room, reason, source);
  }

  /** Sends a command to an engine (engine-link.ts); false when the engine is not connected. */
  command(engine: string, command: CommandName, room: string | null = null, reason?: string) {
    return this.link.command(engine, command, room, reason ?? null);
  }

  /**
   * Engines stalled while alive, why, and since when (stalls.ts), on evidence from after this
   * control plane last could not hear them or move their rooms: its loop blocked, the journal
   * refusing writes, or `lateAt` (the caller's own gap: the ladder's, after a SIGSTOP).
   */
  stalledEngines(policy = DEFAULT_STALL_POLICY, now = this.clock.now(), lateAt = 0): Stall[] {
    return findStalls(this.registry.all(), this.book.live(), policy, now, {
      journalWritable: this.journal.health().writable,
      lateAt: Math.max(this.loopLag.lateAt, this.outage.refusedAt, lateAt),
    });
  }

  /** A canary's verdict on the engines its room ran on (engine-health.ts `recordCanary`). */
  noteCanary(room: RoomOwners | null, verdict: CanaryVerdict): void {
    const writable = this.journal.health().writable;
    if (room)
      recordCanary((id) => this.registry.get(id), room, verdict, writable, this.clock.now());
  }

  /** Resolves once `prefill` and `decode` engines are registered and live. */
  waitForEngines(prefill: number, decode: number, timeoutMs: number): Promise<void> {
    return this.registry.waitFor(prefill, decode, timeoutMs);
  }

  /** Fails every open stream, stops the bus, writes a state checkpoint, drains the journal. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      for (const t of this.timers) this.clock.clear(t);
      this.loopLag.stop();
      this.aborts.close();
      for (const s of this.book.takeAllStreams())
        s.fail(new RoomEndedError(s.room, 'unavailable', 'control plane shutting down'));
      this.subscription?.close();
      await this.bus.close();
      await this.checkpoints?.write();
      await this.journal.drain();
    })();
    return this.closing;
  }
}
