/**
 * A whole fleet in one process (issue 41, item 1): the real control plane, watchdog, escalation
 * ladder and engine cores (prefill and decode on the deterministic model), unchanged, on the
 * simulator's adapters of every port — a virtual clock, seeded randomness and ids, the in-memory
 * journal, network, KV pools and transfer core, and the fleet itself as the ladder's supervisor
 * of engine processes. Nothing here reads the machine's clock or randomness, so a fleet started
 * from a seed runs the same way every time.
 *
 * The control plane is a process too (`controlProcess`): its timers, its journal's commits (the
 * journal is embedded, as SQLite is) and the clients' requests to it wait while it is frozen.
 */
import { Admission } from '../bus/admission.ts';
import type { EngineMessage } from '../bus/protocol.ts';
import type { ControlPlane } from '../control/control-plane.ts';
import type { Canary } from '../control/evidence/canary.ts';
import type { FlowControl } from '../control/flow/flow-control.ts';
import { resolveEngineOptions } from '../engine/options.ts';
import { type WiredEngine, wireEngine } from '../engine/wiring.ts';
import { MemoryDisk } from '../journal/memory/disk.ts';
import type { JournalStore } from '../journal/store.ts';
import { type Logger, silentLogger } from '../log.ts';
import { DeterministicModel } from '../model/deterministic.ts';
import { seededIds } from '../ports/ids.ts';
import { type Random, seeded } from '../ports/random.ts';
import { engineExited } from '../recovery/exits.ts';
import type { EscalationLadder } from '../recovery/ladder.ts';
import type { OutlierDetector } from '../recovery/outliers.ts';
import { restartDelayMs, type Supervisor } from '../recovery/supervisor.ts';
import { ControlPlanes, controlEndpoint } from './control-planes.ts';
import { lyingTransport, type TokensLie } from './lying-wire.ts';
import { SqliteStorage } from './storage.ts';
import { VirtualClock } from './world/clock.ts';
import { type LinkSpec, MemoryNetwork } from './world/network.ts';
import { MemoryPools } from './world/pools.ts';
import { MemoryTransferCore } from './world/transfer-core.ts';

type AppendEvent = EngineMessage<'append'>['event'];

import { ProcessClock } from './process.ts';

export interface FleetOptions {
  seed: number;
  /** Engines of each role. Default 2 and 2. */
  prefill?: number;
  decode?: number;
  /** KV pages per engine, and bytes per page. Default 2048 and 1024. */
  pages?: number;
  pageBytes?: number;
  /** How long a journal commit takes, in ms. Default: drawn for each commit from 1 to 5. */
  commitMs?: number;
  /** How every link behaves to begin with. Default: 1–2 ms each way, nothing lost. */
  link?: Partial<LinkSpec>;
  /** Prefill compute per prompt token on each engine's simulated device, in µs. Default 20. */
  prefillUsPerToken?: number;
  /**
   * How often the background canary runs, in ms; 0: none. Default 1000, as the drills run it
   * (`pdctl serve`'s is 5000: three failures in a row, a stall, would then take longer than most
   * faults last). Its failures count against the engines it ran on.
   */
  canaryEveryMs?: number;
  /** Whether the outlier detector ejects engines whose rooms keep failing by their fault. Default true. */
  outliers?: boolean;
  /**
   * A second control plane stands by, as two `pdctl serve` do on a PostgreSQL journal: the
   * journal has a leader with a lease (control-planes.ts `CONTROL_LEASE_MS`), the engines get both
   * endpoints, and a killed or frozen leader is replaced by the standby, not restarted. Default
   * false: one control plane, restarted on its journal when killed.
   */
  standby?: boolean;
  /**
   * The journal the control plane runs on: `memory` (default), or `sqlite` — SQLite in a temporary
   * file with packing, retention into an archive and the storage faults (storage.ts). Not with a
   * standby (that is PostgreSQL's leadership, which the in-memory journal plays).
   */
  journal?: 'memory' | 'sqlite';
  log?: Logger;
}

/** The virtual time a fleet starts at. */
const EPOCH = Date.UTC(2026, 0, 1);
/** How long a restarted engine takes to come back (its model loading), unless a fault says. */
const RESTART_MS = 500;

export interface SimEngine {
  id: string;
  role: 'prefill' | 'decode';
  engine: WiredEngine;
  /** The process's clock: killing or freezing the process goes through it. */
  process: ProcessClock;
  incarnation: string;
  pid: number;
  /** Prefill: its transfer core, where transfer faults are injected. */
  transfer: MemoryTransferCore | null;
  /** Times the engine was started again before this process. */
  restarts: number;
  /** SIGSTOPped. */
  frozen: boolean;
}

export class Fleet implements Supervisor {
  readonly engines = new Map<string, SimEngine>();
  private nextPid = 1000;
  /** Why each engine's link to the control plane is down (faults, frozen processes): it is up at 0. */
  private readonly cuts = new Map<string, number>();
  private readonly startListeners = new Map<string, Set<(sim: SimEngine) => void>>();
  /** The engines that lie now (faults.ts `lie`), each with how it rewrites what it appends. */
  private readonly lies = new Map<string, (event: AppendEvent) => AppendEvent>();
  /** The decode engines that lie about rooms not their own, with how they rewrite their tokens. */
  private readonly tokenLies = new Map<string, TokensLie>();
  /** How many appends (and tokens messages) each engine rewrote while it lied. */
  readonly lied = new Map<string, number>();
  private stopping = false;
  /** The control-plane processes: the leader, and with `standby` the one waiting to take over. */
  private readonly planes: ControlPlanes;

  private constructor(
    readonly seed: number,
    readonly clock: VirtualClock,
    readonly random: Random,
    readonly network: MemoryNetwork,
    readonly disk: MemoryDisk,
    readonly storage: SqliteStorage | null,
    private readonly pools: MemoryPools,
    private readonly admission: Admission,
    private readonly options: FleetOptions,
    private readonly log: Logger,
  ) {
    this.planes = new ControlPlanes(this, {
      standby: options.standby === true,
      ...(options.commitMs !== undefined ? { commitMs: options.commitMs } : {}),
      canaryEveryMs: options.canaryEveryMs ?? 1000,
      outliers: options.outliers !== false,
      admission,
      log,
    });
  }

  /** Starts the control plane and its engines, and runs the clock until every engine is live. */
  static async start(options: FleetOptions): Promise<Fleet> {
    const clock = new VirtualClock(EPOCH);
    const random = seeded(options.seed);
    const link = { delayMs: [1, 2] as const, loss: 0, duplicate: 0, reorder: 0, up: true };
    const network = new MemoryNetwork(clock, random.fork('network'), { ...link, ...options.link });
    if (options.journal === 'sqlite' && options.standby)
      throw new RangeError(
        'a standby control plane needs the in-memory journal (it plays PostgreSQL); drop --standby or --journal sqlite',
      );
    const disk = new MemoryDisk(`sim-${options.seed}`);
    const fleet = new Fleet(
      options.seed,
      clock,
      random,
      network,
      disk,
      options.journal === 'sqlite' ? SqliteStorage.create(disk, random.fork('storage')) : null,
      new MemoryPools(),
      new Admission(),
      options,
      options.log ?? silentLogger,
    );
    await clock.runUntil(fleet.planes.startFirst());
    const prefill = options.prefill ?? 2;
    const decode = options.decode ?? 2;
    for (let i = 0; i < prefill; i++) fleet.startEngine(`prefill-${i}`, 'prefill');
    for (let i = 0; i < decode; i++) fleet.startEngine(`decode-${i}`, 'decode');
    await clock.runUntil(fleet.control.waitForEngines(prefill, decode, 10_000));
    return fleet;
  }

  /** The control plane's current process (the last one, while it is down). */
  get control(): ControlPlane {
    return this.planes.live.control;
  }

  get journal(): JournalStore {
    return this.planes.live.journal;
  }

  /** The current control plane's flow control: where a client's request waits its turn. */
  get flow(): FlowControl {
    return this.planes.live.flow;
  }

  get controlProcess(): ProcessClock {
    return this.planes.live.process;
  }

  /** The control plane's background canary. */
  get canary(): Canary {
    return this.planes.live.canary;
  }

  /** The control plane's outlier detector. */
  get outliers(): OutlierDetector {
    return this.planes.live.outliers;
  }

  get ladder(): EscalationLadder {
    return this.planes.live.ladder;
  }

  /** Whether the control plane's process is up (not between a kill and its restart). */
  get controlUp(): boolean {
    return this.planes.live.process.alive;
  }

  /** Settles when the control plane's current process dies. */
  get controlDied(): Promise<void> {
    return this.planes.live.died.promise;
  }

  /** Why a control plane failed to start (each is a defect); its supervisor tries again a second later. */
  get controlStartFailures(): readonly string[] {
    return this.planes.startFailures;
  }

  /** The hosts whose control plane found itself deposed and exited, in order. */
  get deposed(): readonly string[] {
    return this.planes.deposed;
  }

  /** Calls `fn` each time a control-plane process has started (after the first). */
  onControlStarted(fn: () => void): void {
    this.planes.onStarted(fn);
  }

  /** The disk refuses writes with `why` (a full disk), for this journal and the next; null: it takes them. */
  refuseWrites(why: string | null): void {
    this.planes.refuseWrites(why);
  }

  /** SIGKILL of the control plane (control-planes.ts `kill`). */
  killControl(restartMs: number): void {
    this.planes.kill(restartMs);
  }

  /** SIGSTOP of the control plane; returns its SIGCONT (control-planes.ts `freeze`). */
  freezeControl(): () => void {
    return this.planes.freeze();
  }

  /**
   * Runs `fn` in the control plane's process: now, or once it runs again if it is stopped (a
   * client's request or disconnect waits in its socket meanwhile).
   */
  inControl(fn: () => void): void {
    this.planes.inControl(fn);
  }

  /** Starts an engine process on its own simulated host. */
  startEngine(id: string, role: 'prefill' | 'decode', restarts = 0): SimEngine {
    const { options } = this;
    const clock = new ProcessClock(this.clock);
    const pid = this.nextPid++;
    // Each process of the engine draws its own ids and nonces: its pid tells them apart.
    const random = this.random.fork(`engine ${id} ${pid}`);
    const opts = resolveEngineOptions({
      id,
      role,
      control: this.planes.hosts.map(controlEndpoint).join(','),
      poolName: `/sim-${id}`,
      pages: options.pages ?? 2048,
      pageBytes: options.pageBytes ?? 1024,
      kvTransport: 'shm',
      prefillUsPerToken: options.prefillUsPerToken ?? 20,
      prefillCompute: 'device',
      // A run's end drains every engine: one that holds a room by then is reported, not waited for.
      drainTimeoutMs: 5000,
    });
    const pool = this.pools.create(opts.poolName, opts.pages, opts.pageBytes);
    const model = new DeterministicModel(opts, clock);
    const ids = seededIds(clock, random.fork('ids'));
    const keys = {
      ...this.admission.issue(id),
      serverKey: this.admission.server.publicKey,
      curve: false,
    };
    const transfer = role === 'prefill' ? new MemoryTransferCore(clock) : null;
    const incarnation = ids.uuid();
    const engine = wireEngine({
      opts,
      log: this.log,
      keys,
      model,
      incarnation,
      pool,
      transfer,
      ucx: null,
      kvRemote: null,
      pid,
      host: 'sim',
      kvSend: 'shm',
      openPool: (name) => this.pools.open(name),
      clock,
      ids,
      transport: lyingTransport(this.network.host(id), () => this.tokenLies.get(id) ?? null),
      says: (event) => {
        const lie = this.lies.get(id);
        const said = lie ? lie(event) : event;
        if (said !== event) this.lied.set(id, (this.lied.get(id) ?? 0) + 1);
        return said;
      },
      nonce: () => Array.from({ length: 24 }, () => random.int(16).toString(16)).join(''),
      // As `pdctl engine` does: it exits (code 1), and its supervisor starts it again.
      refused: () => this.end(id, { pid, code: 1, restartMs: restartDelayMs(restarts) }),
      release: async () => {
        await transfer?.close();
        pool.close();
        this.pools.unlink(opts.poolName);
      },
    });
    const sim = {
      id,
      role,
      engine,
      process: clock,
      incarnation,
      pid,
      transfer,
      restarts,
      frozen: false,
    };
    this.engines.set(id, sim);
    for (const started of this.startListeners.get(id) ?? []) started(sim);
    return sim;
  }

  /**
   * The engine lies from now on, within the protocol, about the other role: a decode engine fails
   * each room whose KV arrived saying its prefill failed; a prefill engine fails each room it
   * starts saying the decode engine refused its pages. (Its lies are refused, and count against
   * it: control/engines/engine-appends.ts, recovery/outliers.ts.) `null`: it tells the truth again.
   */
  lie(id: string, on: boolean, shape: LieShape | 'blame' = 'blame'): void {
    if (!on) {
      this.lies.delete(id);
      this.tokenLies.delete(id);
      return;
    }
    const role = this.engines.get(id)?.role === 'prefill' ? 'prefill' : 'decode';
    if (shape !== 'blame') {
      this.lies.set(id, lieAbout(shape, id, role, this));
      // Its tokens too: a decode engine streams them, and a prefill engine its first tokens
      // (protocol 9), for another engine's room.
      if (ownShape(shape, role) === 'foreign')
        this.tokenLies.set(id, (msg) => {
          const other = this.foreignRoom(id, role);
          if (other === null || other === msg.room) return msg;
          this.lied.set(id, (this.lied.get(id) ?? 0) + 1);
          return { ...msg, room: other };
        });
      return;
    }
    const [when, reason, stage] =
      role === 'decode'
        ? (['room.decode_started', 'prefill_error', 'transferred'] as const)
        : (['room.prefill_started', 'kv_reservation_refused', 'waiting_for_input'] as const);
    this.lies.set(id, (event) =>
      event.type === when
        ? {
            type: 'room.failed',
            room: event.room,
            data: { reason, stage, detectedBy: `engine:${id}` },
          }
        : event,
    );
  }

  /** The live room of another engine of `role` than `engine` (the first in the book), if any. */
  foreignRoom(engine: string, role: 'prefill' | 'decode'): string | null {
    for (const r of this.disk.rooms.values()) {
      const owner = role === 'prefill' ? r.prefillEngine : r.decodeEngine;
      if (r.deadlineAt !== null && owner !== null && owner !== engine) return r.room;
    }
    return null;
  }

  /** Calls `fn` each time a process of the engine starts; returns what stops it. */
  onStarted(id: string, fn: (sim: SimEngine) => void): () => void {
    const all = this.startListeners.get(id) ?? new Set();
    all.add(fn);
    this.startListeners.set(id, all);
    return () => all.delete(fn);
  }

  /**
   * SIGKILL: the engine's process and sockets end at once. As `pdctl serve`'s supervisor does, the
   * exit is journaled and its rooms continue elsewhere at once, and the engine is started again
   * `restartMs` later (its model loading), as a new incarnation with a new pool.
   */
  kill(id: string, restartMs = RESTART_MS): void {
    this.end(id, { restartMs });
  }

  /** SIGSTOP: nothing of the engine runs, and nothing reaches it or leaves it, until `thaw`. */
  freeze(id: string): void {
    const sim = this.engines.get(id);
    if (!sim?.process.alive || sim.frozen) return;
    sim.frozen = true;
    sim.process.freeze();
    this.cut(id);
  }

  /** SIGCONT. */
  thaw(id: string): void {
    const sim = this.engines.get(id);
    if (!sim?.frozen) return;
    sim.frozen = false;
    this.mend(id);
    sim.process.thaw();
  }

  /**
   * Takes the links between the control planes (on `hosts`: all of them unless told) and the
   * engine down for one more reason.
   */
  cut(id: string, hosts: readonly string[] = this.planes.hosts): void {
    for (const host of hosts) {
      const link = `${host} ${id}`;
      const n = this.cuts.get(link) ?? 0;
      this.cuts.set(link, n + 1);
      if (n === 0) this.network.partition(host, id);
    }
  }

  /** Ends one reason each link is down; it is up again once none is left. */
  mend(id: string, hosts: readonly string[] = this.planes.hosts): void {
    for (const host of hosts) {
      const link = `${host} ${id}`;
      const n = this.cuts.get(link) ?? 0;
      if (n === 0) continue;
      this.cuts.set(link, n - 1);
      if (n === 1) this.network.heal(host, id);
    }
  }

  // ── the supervisor port (recovery/supervisor.ts), for the ladder ──

  pid(id: string): number | undefined {
    const sim = this.engines.get(id);
    return sim?.process.alive ? sim.pid : undefined;
  }

  /** SIGHUP resets the engine in place (once it runs: a stopped process takes it at SIGCONT). */
  signal(id: string, sig: NodeJS.Signals): boolean {
    const sim = this.engines.get(id);
    if (!sim?.process.alive) return false;
    if (sig === 'SIGKILL') this.kill(id);
    else if (sig === 'SIGHUP') sim.process.defer(() => sim.engine.resetInPlace('SIGHUP'));
    else return false;
    return true;
  }

  ids(): string[] {
    return [...this.engines.keys()];
  }

  restartNow(id: string): Promise<number | undefined> {
    const sim = this.engines.get(id);
    if (!sim?.process.alive || this.stopping) return Promise.resolve(undefined);
    return new Promise((resolve) =>
      this.end(id, { expected: true, restartMs: RESTART_MS, restarted: resolve }),
    );
  }

  /**
   * The engine's process ends — SIGKILL, or exit `code` on its own (only if `pid` is still the
   * engine's process) — and starts again `restartMs` later. `expected`: the ladder replaced it.
   */
  private end(
    id: string,
    how: {
      restartMs: number;
      expected?: boolean;
      pid?: number;
      code?: number;
      restarted?: (pid: number | undefined) => void;
    },
  ): void {
    const { restartMs, expected = false, restarted } = how;
    const sim = this.engines.get(id);
    if (!sim?.process.alive || (how.pid !== undefined && how.pid !== sim.pid)) {
      restarted?.(undefined);
      return;
    }
    sim.process.kill();
    this.network.kill(id);
    // A stopped process dies too: its replacement is not stopped.
    if (sim.frozen) {
      sim.frozen = false;
      this.mend(id);
    }
    // The supervisor is the control plane's process (`pdctl serve`): it hears the exit when it runs.
    this.controlProcess.defer(() =>
      engineExited(this.control, this.journal, this.log, {
        engine: id,
        pid: sim.pid,
        code: how.code ?? null,
        signal: how.code === undefined ? 'SIGKILL' : null,
        restarts: sim.restarts,
        expected,
      }),
    );
    this.clock.setTimeout(() => {
      const next = this.stopping ? undefined : this.startEngine(id, sim.role, sim.restarts + 1);
      restarted?.(next?.pid);
    }, restartMs);
  }

  /** Stops the engines (they drain), then the control plane, running the clock meanwhile. */
  async stop(): Promise<void> {
    this.stopping = true;
    this.planes.stopOthers();
    const leader = this.planes.live;
    leader.watchdog.stop();
    leader.ladder.stop();
    leader.outliers.stop();
    await this.clock.runUntil(leader.canary.stop(), 60_000);
    if (leader.retention) await this.clock.runUntil(leader.retention.stop(), 60_000);
    const live = [...this.engines.values()].filter((e) => e.process.alive);
    await this.clock.runUntil(Promise.all(live.map((e) => e.engine.stop('the run ended'))), 60_000);
    await this.clock.runUntil(this.control.close(), 60_000);
    // The control plane leaves its journal to its owner, as `pdctl serve` does; the run's files go.
    if (this.storage) {
      leader.journal.close();
      this.storage.remove();
    }
  }
}

/**
 * What an engine can lie about beyond whom it blames (`lie-protocol`): `foreign` — its appends
 * (all but its releases), and a decode engine's tokens (lying-wire.ts), name a live room of
 * another engine of its role; `pool` — a decode engine's `room.bootstrapped`
 * names another decode engine's pool and an epoch past it; `phantom` — a prefill engine says its
 * transfers completed with bytes they do not hold (a checksum of nothing it sent: the decode
 * engine is told `kv_arrived` for a transfer that is not so); `blocks` —
 * a prefill engine says it stored prefix blocks it never computed. A shape the engine's role
 * cannot tell (`pool` of a prefill engine, `phantom` or `blocks` of a decode one) is `foreign`.
 */
export const LIE_SHAPES = ['foreign', 'pool', 'phantom', 'blocks'] as const;
export type LieShape = (typeof LIE_SHAPES)[number];

/** The shape an engine of `role` tells: one its role cannot tell is `foreign`. */
function ownShape(shape: LieShape, role: 'prefill' | 'decode'): LieShape {
  const fits = shape === 'foreign' || (shape === 'pool' ? role === 'decode' : role === 'prefill');
  return fits ? shape : 'foreign';
}

function lieAbout(
  shape: LieShape,
  id: string,
  role: 'prefill' | 'decode',
  fleet: Pick<Fleet, 'foreignRoom'>,
): (event: AppendEvent) => AppendEvent {
  const own = ownShape(shape, role);
  return (event) => {
    if (own === 'pool' && event.type === 'room.bootstrapped') {
      const other = id === 'decode-0' ? 'decode-1' : 'decode-0';
      const epoch = typeof event.data.epoch === 'number' ? event.data.epoch + 7 : 7;
      return { ...event, data: { ...event.data, pool: `/sim-${other}`, epoch } } as AppendEvent;
    }
    if (own === 'phantom' && event.type === 'room.transfer_completed')
      return { ...event, data: { ...event.data, checksum: '0badf00d' } } as AppendEvent;
    if (own === 'blocks' && event.type === 'room.transfer_posted') {
      const made = [1, 2, 3].map((n) => `${id}-${event.room}-${n}`.padEnd(32, '0').slice(0, 32));
      const hex = made.map((m) => Buffer.from(m).toString('hex').slice(0, 32));
      const stored = Array.isArray(event.data.storedBlocks) ? event.data.storedBlocks : [];
      return {
        ...event,
        data: { ...event.data, storedBlocks: [...stored, ...hex] },
      } as AppendEvent;
    }
    // Its releases stay its own: an engine that never frees its rooms is another fault (a leak
    // only its restart ends), not a word about another engine.
    if (own === 'foreign' && event.type !== 'room.released') {
      const other = fleet.foreignRoom(id, role);
      if (other !== null && other !== event.room) return { ...event, room: other } as AppendEvent;
    }
    return event;
  };
}
