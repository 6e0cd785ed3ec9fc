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
import { type LinkSpec, MemoryNetwork } from '../bus/memory/network.ts';
import { Canary } from '../control/canary.ts';
import { ControlPlane } from '../control/control-plane.ts';
import { resolveEngineOptions } from '../engine/options.ts';
import { type WiredEngine, wireEngine } from '../engine/wiring.ts';
import { MemoryDisk } from '../journal/memory/disk.ts';
import { MemoryJournal } from '../journal/memory/journal.ts';
import { type Logger, silentLogger } from '../log.ts';
import { DeterministicModel } from '../model/deterministic.ts';
import { VirtualClock } from '../ports/clock.ts';
import { seededIds } from '../ports/ids.ts';
import { type Random, seeded } from '../ports/random.ts';
import { engineExited } from '../recovery/exits.ts';
import { EscalationLadder } from '../recovery/ladder.ts';
import { OutlierDetector } from '../recovery/outliers.ts';
import { restartDelayMs, type Supervisor } from '../recovery/supervisor.ts';
import { Watchdog } from '../recovery/watchdog.ts';
import { MemoryTransferCore } from '../transfer/memory/core.ts';
import { MemoryPools } from '../transfer/memory/pool.ts';
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
   * journal has a leader with a lease (`CONTROL_LEASE_MS`), the engines are given both
   * endpoints, and a killed or frozen leader is replaced by the standby, not restarted. Default
   * false: one control plane, restarted on its journal when killed.
   */
  standby?: boolean;
  log?: Logger;
}

/** Where a control plane on `host` listens on the simulated network. */
const controlEndpoint = (host: string) => `tcp://${host}:5557`;
/** The lease of a leader of the journal, with a standby (as the failover drill runs it). */
export const CONTROL_LEASE_MS = 1000;
/** The virtual time a fleet starts at. */
const EPOCH = Date.UTC(2026, 0, 1);
/** How long a restarted engine takes to come back (its model loading), unless a fault says. */
const RESTART_MS = 500;

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve = () => {};
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

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

/** One process of the control plane: its clock, its embedded journal, and what runs in it. */
interface SimControl {
  /** The simulated host it runs on. */
  host: string;
  process: ProcessClock;
  /** SIGSTOPs not yet ended (overlapping freezes hold it until the last one ends). */
  frozen: number;
  /** Settles when the process dies (its clients' connections reset). */
  died: { promise: Promise<void>; resolve: () => void };
  journal: MemoryJournal;
  control: ControlPlane;
  watchdog: Watchdog;
  ladder: EscalationLadder;
  canary: Canary;
  outliers: OutlierDetector;
}

export class Fleet implements Supervisor {
  readonly engines = new Map<string, SimEngine>();
  private nextPid = 1000;
  /** Why each engine's link to the control plane is down (faults, frozen processes): it is up at 0. */
  private readonly cuts = new Map<string, number>();
  private readonly startListeners = new Map<string, Set<(sim: SimEngine) => void>>();
  private readonly controlListeners = new Set<() => void>();
  /** Why the disk refuses writes (a fault), for every journal opened on it; null: it takes them. */
  private diskFull: string | null = null;
  private stopping = false;
  /** Control-plane processes started so far. */
  private generation = 0;
  private current: SimControl | null = null;
  /** Why a control plane failed to start (each is a defect); its supervisor tries again a second later. */
  readonly controlStartFailures: string[] = [];
  /** The hosts control planes run on: one, or the leader's and the standby's. */
  private readonly controlHosts: string[];
  /** The hosts whose control plane found itself deposed and exited, in order. */
  readonly deposed: string[] = [];
  /** Control-plane processes that do not lead: standing by, or deposed and not yet exited. */
  private readonly others = new Set<{ host: string; process: ProcessClock; stop?: () => void }>();

  private constructor(
    readonly seed: number,
    readonly clock: VirtualClock,
    readonly random: Random,
    readonly network: MemoryNetwork,
    readonly disk: MemoryDisk,
    private readonly pools: MemoryPools,
    private readonly admission: Admission,
    private readonly options: FleetOptions,
    private readonly log: Logger,
  ) {
    this.controlHosts = options.standby ? ['control-a', 'control-b'] : ['control'];
  }

  /** Starts the control plane and its engines, and runs the clock until every engine is live. */
  static async start(options: FleetOptions): Promise<Fleet> {
    const clock = new VirtualClock(EPOCH);
    const random = seeded(options.seed);
    const link = { delayMs: [1, 2] as const, loss: 0, duplicate: 0, reorder: 0, up: true };
    const network = new MemoryNetwork(clock, random.fork('network'), { ...link, ...options.link });
    const fleet = new Fleet(
      options.seed,
      clock,
      random,
      network,
      new MemoryDisk(`sim-${options.seed}`),
      new MemoryPools(),
      new Admission(),
      options,
      options.log ?? silentLogger,
    );
    await clock.runUntil(fleet.startControl(fleet.controlHosts[0] as string));
    if (options.standby) fleet.restartControl('control-b');
    const prefill = options.prefill ?? 2;
    const decode = options.decode ?? 2;
    for (let i = 0; i < prefill; i++) fleet.startEngine(`prefill-${i}`, 'prefill');
    for (let i = 0; i < decode; i++) fleet.startEngine(`decode-${i}`, 'decode');
    await clock.runUntil(fleet.control.waitForEngines(prefill, decode, 10_000));
    return fleet;
  }

  /**
   * A control-plane process on `host`: the journal opened on the fleet's disk (it is embedded, as
   * SQLite is; with a standby, it first waits to lead it), `ControlPlane.start` on it, the
   * watchdog and the ladder — whose supervisor is this fleet.
   */
  private async startControl(host: string): Promise<void> {
    const { clock, random, options, log } = this;
    const process = new ProcessClock(clock);
    // A restarted control plane draws from streams of its own, as a new process would.
    const n = this.generation++;
    const ids = seededIds(clock, random.fork(n === 0 ? 'control ids' : `control ids ${n}`));
    const disks = random.fork(n === 0 ? 'disk' : `disk ${n}`);
    const commitMs = options.commitMs ?? (() => disks.between(1, 5));
    const opened = { disk: this.disk, clock: process, ids, commitMs };
    let journal: MemoryJournal;
    if (options.standby) {
      const waiting = { host, process };
      this.others.add(waiting);
      journal = await MemoryJournal.standBy({
        ...opened,
        lead: { holder: host, leaseMs: CONTROL_LEASE_MS },
      });
      this.others.delete(waiting);
    } else journal = MemoryJournal.open(opened);
    journal.refuseWrites(this.diskFull);
    const control = await ControlPlane.start({
      journal,
      admission: this.admission,
      log,
      version: 'sim',
      bus: controlEndpoint(host),
      curve: false,
      clock: process,
      ids,
      transport: this.network.host(host),
      model: new DeterministicModel({}, process),
    });
    const watchdog = new Watchdog(control, journal, log, 100, process);
    watchdog.start();
    const ladder = new EscalationLadder(control, journal, this, log, {}, process);
    ladder.start();
    // As `pdctl serve` runs them (app/serving.ts, app/stack.ts).
    const canary = new Canary(control, log, 2000, process);
    const canaryEveryMs = options.canaryEveryMs ?? 1000;
    if (canaryEveryMs > 0) canary.start(canaryEveryMs);
    const outliers = new OutlierDetector(control, journal, log, {}, process, ladder);
    if (options.outliers !== false) outliers.start();
    const c: SimControl = {
      host,
      process,
      frozen: 0,
      died: deferred(),
      journal,
      control,
      watchdog,
      ladder,
      canary,
      outliers,
    };
    // As `pdctl serve` does, a leader that finds another took the journal exits (code 3), and is
    // started again as a standby.
    journal.onDeposed(() => this.exitDeposed(c));
    // The leader it replaced, if its process lives on (stopped), finds itself deposed when it runs.
    if (this.current?.process.alive) this.others.add(this.current);
    this.current = c;
    for (const started of this.controlListeners) started();
  }

  /** The deposed leader's process exits; it is started again, to stand by, a moment later. */
  private exitDeposed(c: SimControl): void {
    if (!c.process.alive) return;
    this.deposed.push(c.host);
    this.others.delete(c);
    this.endControl(c);
    this.clock.setTimeout(() => this.restartControl(c.host), RESTART_MS);
  }

  /** The process ends at once: its timers, its sockets, its journal's commits in flight. */
  private endControl(c: SimControl): void {
    if (c.frozen > 0) {
      c.frozen = 0;
      for (const id of this.engines.keys()) this.mend(id, [c.host]);
    }
    c.process.kill();
    this.network.kill(c.host);
    c.journal.crash();
    c.died.resolve();
  }

  private get live(): SimControl {
    if (!this.current) throw new Error('the control plane is not running');
    return this.current;
  }

  /** The control plane's current process (the last one, while it is down). */
  get control(): ControlPlane {
    return this.live.control;
  }

  get journal(): MemoryJournal {
    return this.live.journal;
  }

  get controlProcess(): ProcessClock {
    return this.live.process;
  }

  /** The control plane's background canary. */
  get canary(): Canary {
    return this.live.canary;
  }

  get ladder(): EscalationLadder {
    return this.live.ladder;
  }

  /** Whether the control plane's process is up (not between a kill and its restart). */
  get controlUp(): boolean {
    return this.live.process.alive;
  }

  /** Settles when the control plane's current process dies. */
  get controlDied(): Promise<void> {
    return this.live.died.promise;
  }

  /** Calls `fn` each time a control-plane process has started (after the first). */
  onControlStarted(fn: () => void): void {
    this.controlListeners.add(fn);
  }

  /** The disk refuses writes with `why` (a full disk), for this journal and the next; null: it takes them. */
  refuseWrites(why: string | null): void {
    this.diskFull = why;
    this.live.journal.refuseWrites(why);
  }

  /**
   * SIGKILL of the control plane (deployed apart from its engines, which live on): its timers and
   * sockets end at once, and its journal's commits in flight are lost; what committed stays on
   * the disk. It starts again `restartMs` later on that disk, and the engines reconnect.
   */
  killControl(restartMs: number): void {
    const c = this.live;
    if (!c.process.alive) return;
    // A stopped process dies too: the new one is not stopped.
    this.endControl(c);
    // With a standby, it takes over; the killed one comes back to stand by.
    this.clock.setTimeout(() => this.restartControl(c.host), restartMs);
  }

  private restartControl(host: string): void {
    if (this.stopping) return;
    this.startControl(host).catch((err: Error) => {
      this.controlStartFailures.push(err.message);
      this.clock.setTimeout(() => this.restartControl(host), 1000);
    });
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
      control: this.controlHosts.map(controlEndpoint).join(','),
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
      transport: this.network.host(id),
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
   * SIGSTOP to the control plane: its timers, commits, messages and clients' requests wait. Freezes
   * that overlap hold it until the last of them ends. Returns its SIGCONT: what fell due meanwhile
   * runs at once, as for a real process — one that was killed meanwhile stays dead, and one a
   * standby replaced meanwhile finds itself deposed.
   */
  freezeControl(): () => void {
    const c = this.current;
    if (!c?.process.alive) return () => {};
    if (c.frozen++ === 0) {
      c.process.freeze();
      for (const id of this.engines.keys()) this.cut(id, [c.host]);
    }
    return () => {
      if (!c.process.alive || c.frozen === 0 || --c.frozen > 0) return;
      for (const id of this.engines.keys()) this.mend(id, [c.host]);
      c.process.thaw();
    };
  }

  /**
   * Runs `fn` in the control plane's process: now, or once it runs again if it is stopped (a
   * client's request or disconnect waits in its socket meanwhile).
   */
  inControl(fn: () => void): void {
    if (this.live.frozen > 0) this.controlProcess.defer(fn);
    else fn();
  }

  /**
   * Takes the links between the control planes (on `hosts`: all of them unless told) and the
   * engine down for one more reason.
   */
  cut(id: string, hosts: readonly string[] = this.controlHosts): void {
    for (const host of hosts) {
      const link = `${host} ${id}`;
      const n = this.cuts.get(link) ?? 0;
      this.cuts.set(link, n + 1);
      if (n === 0) this.network.partition(host, id);
    }
  }

  /** Ends one reason each link is down; it is up again once none is left. */
  mend(id: string, hosts: readonly string[] = this.controlHosts): void {
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
    // Standbys, and a deposed leader still stopped, end with the run.
    for (const other of this.others) other.process.kill();
    this.others.clear();
    this.live.watchdog.stop();
    this.live.ladder.stop();
    this.live.outliers.stop();
    await this.clock.runUntil(this.live.canary.stop(), 60_000);
    const live = [...this.engines.values()].filter((e) => e.process.alive);
    await this.clock.runUntil(Promise.all(live.map((e) => e.engine.stop('the run ended'))), 60_000);
    await this.clock.runUntil(this.control.close(), 60_000);
  }
}
