/**
 * A whole fleet in one process (issue 41, item 1): the real control plane, watchdog and engine
 * cores (prefill and decode on the deterministic model), unchanged, on the simulator's adapters
 * of every port — a virtual clock, seeded randomness and ids, the in-memory journal, network,
 * KV pools and transfer core. Nothing here reads the machine's clock or randomness, so a fleet
 * started from a seed runs the same way every time.
 */
import { Admission } from '../bus/admission.ts';
import { type LinkSpec, MemoryNetwork } from '../bus/memory/network.ts';
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
  log?: Logger;
}

/** Where the control plane listens on the simulated network. */
const CONTROL_ENDPOINT = 'tcp://control:5557';
/** The virtual time a fleet starts at. */
const EPOCH = Date.UTC(2026, 0, 1);

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
}

export class Fleet {
  readonly engines = new Map<string, SimEngine>();
  private nextPid = 1000;
  private constructor(
    readonly seed: number,
    readonly clock: VirtualClock,
    readonly random: Random,
    readonly network: MemoryNetwork,
    readonly disk: MemoryDisk,
    readonly journal: MemoryJournal,
    readonly control: ControlPlane,
    readonly watchdog: Watchdog,
    private readonly pools: MemoryPools,
    private readonly admission: Admission,
    private readonly options: FleetOptions,
    private readonly log: Logger,
  ) {}

  /** Starts the control plane and its engines, and runs the clock until every engine is live. */
  static async start(options: FleetOptions): Promise<Fleet> {
    const clock = new VirtualClock(EPOCH);
    const random = seeded(options.seed);
    const link = { delayMs: [1, 2] as const, loss: 0, duplicate: 0, reorder: 0, up: true };
    const network = new MemoryNetwork(clock, random.fork('network'), { ...link, ...options.link });
    const disk = new MemoryDisk(`sim-${options.seed}`);
    const ids = seededIds(clock, random.fork('control ids'));
    const disks = random.fork('disk');
    const commitMs = options.commitMs ?? (() => disks.between(1, 5));
    const journal = MemoryJournal.open({ disk, clock, ids, commitMs });
    const log = options.log ?? silentLogger;
    const admission = new Admission();
    const control = await clock.runUntil(
      ControlPlane.start({
        journal,
        admission,
        log,
        version: 'sim',
        bus: CONTROL_ENDPOINT,
        curve: false,
        clock,
        ids,
        transport: network.host('control'),
        model: new DeterministicModel({}, clock),
      }),
    );
    const watchdog = new Watchdog(control, journal, log, 100, clock);
    watchdog.start();
    const fleet = new Fleet(
      options.seed,
      clock,
      random,
      network,
      disk,
      journal,
      control,
      watchdog,
      new MemoryPools(),
      admission,
      options,
      log,
    );
    const prefill = options.prefill ?? 2;
    const decode = options.decode ?? 2;
    for (let i = 0; i < prefill; i++) fleet.startEngine(`prefill-${i}`, 'prefill');
    for (let i = 0; i < decode; i++) fleet.startEngine(`decode-${i}`, 'decode');
    await clock.runUntil(control.waitForEngines(prefill, decode, 10_000));
    return fleet;
  }

  /** Starts an engine process on its own simulated host. */
  startEngine(id: string, role: 'prefill' | 'decode'): SimEngine {
    const { options } = this;
    const clock = new ProcessClock(this.clock);
    const pid = this.nextPid++;
    // Each process of the engine draws its own ids and nonces: its pid tells them apart.
    const random = this.random.fork(`engine ${id} ${pid}`);
    const opts = resolveEngineOptions({
      id,
      role,
      control: CONTROL_ENDPOINT,
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
      refused: () => void engine.stop('refused by the control plane'),
      release: async () => {
        await transfer?.close();
        pool.close();
        this.pools.unlink(opts.poolName);
      },
    });
    const sim = { id, role, engine, process: clock, incarnation, pid, transfer };
    this.engines.set(id, sim);
    return sim;
  }

  /**
   * SIGKILL: the engine's process and sockets end at once. As `pdctl serve`'s supervisor does, the
   * exit is journaled and its rooms continue elsewhere at once, and the engine is started again
   * `restartMs` later (its model loading), as a new incarnation with a new pool.
   */
  kill(id: string, restartMs = 500): void {
    const sim = this.engines.get(id);
    if (!sim?.process.alive) return;
    sim.process.kill();
    this.network.kill(id);
    engineExited(this.control, this.journal, this.log, {
      engine: id,
      pid: sim.pid,
      code: null,
      signal: 'SIGKILL',
      restarts: 0,
      expected: false,
    });
    this.clock.setTimeout(() => this.startEngine(id, sim.role), restartMs);
  }

  /** SIGSTOP: nothing of the engine runs, and nothing reaches it or leaves it, until `thaw`. */
  freeze(id: string): void {
    const sim = this.engines.get(id);
    if (!sim) return;
    sim.process.freeze();
    this.network.partition('control', id);
  }

  /** SIGCONT. */
  thaw(id: string): void {
    const sim = this.engines.get(id);
    if (!sim) return;
    this.network.heal('control', id);
    sim.process.thaw();
  }

  /** Stops the engines (they drain), then the control plane, running the clock meanwhile. */
  async stop(): Promise<void> {
    this.watchdog.stop();
    const live = [...this.engines.values()].filter((e) => e.process.alive);
    await this.clock.runUntil(Promise.all(live.map((e) => e.engine.stop('the run ended'))), 60_000);
    await this.clock.runUntil(this.control.close(), 60_000);
  }
}
