/**
 * The control-plane processes of a simulated fleet (issue 41): the one that leads and, with a
 * standby, the one waiting to — each with its own clock, its embedded journal, and what
 * `pdctl serve` runs in it (the control plane, watchdog, escalation ladder, canary and outlier
 * detector). With one control plane, a killed one is started again on its journal; with a
 * standby, the journal has PostgreSQL's leadership (journal/memory/leadership.ts): a killed or
 * frozen leader is replaced by the standby, and comes back to stand by.
 */
import type { Admission } from '../bus/admission.ts';
import { ControlPlane } from '../control/control-plane.ts';
import { Canary } from '../control/evidence/canary.ts';
import { FLOW_DEFAULTS, FlowControl } from '../control/flow/flow-control.ts';
import type { MemoryDisk } from '../journal/memory/disk.ts';
import type { Retention } from '../journal/retention.ts';
import type { JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { DeterministicModel } from '../model/deterministic.ts';
import { seededIds } from '../ports/ids.ts';
import type { Random } from '../ports/random.ts';
import { EscalationLadder } from '../recovery/ladder.ts';
import { OutlierDetector } from '../recovery/outliers.ts';
import type { Supervisor } from '../recovery/supervisor.ts';
import { Watchdog } from '../recovery/watchdog.ts';
import { ProcessClock } from './process.ts';
import { SIM_CHECKPOINT_EVERY_MS, type SqliteStorage } from './storage.ts';
import type { VirtualClock } from './world/clock.ts';
import { MemoryJournal } from './world/journal.ts';
import type { MemoryNetwork } from './world/network.ts';

/** Where a control plane on `host` listens on the simulated network. */
export const controlEndpoint = (host: string) => `tcp://${host}:5557`;
/** The lease of a leader of the journal, with a standby (as the failover drill runs it). */
export const CONTROL_LEASE_MS = 1000;
/** How long a deposed control plane takes to come back as a standby. */
const REJOIN_MS = 500;

/** One process of the control plane: its clock, its embedded journal, and what runs in it. */
export interface SimControl {
  /** The simulated host it runs on. */
  host: string;
  process: ProcessClock;
  /** SIGSTOPs not yet ended (overlapping freezes hold it until the last one ends). */
  frozen: number;
  /** Settles when the process dies (its clients' connections reset). */
  died: { promise: Promise<void>; resolve: () => void };
  /** In memory, or (`--journal sqlite`) SQLite in a file, with retention into an archive. */
  journal: MemoryJournal | JournalStore;
  retention: Retention | null;
  control: ControlPlane;
  watchdog: Watchdog;
  ladder: EscalationLadder;
  canary: Canary;
  outliers: OutlierDetector;
  /** Flow control in front of admission, as the serving API runs it (api/app.ts). */
  flow: FlowControl;
}

/** What the control planes run on: the fleet (their supervisor of engines, too). */
export interface ControlPlanesHost extends Supervisor {
  readonly clock: VirtualClock;
  readonly random: Random;
  readonly network: MemoryNetwork;
  readonly disk: MemoryDisk;
  /** With `--journal sqlite`: the file, the archive and their faults; null: the in-memory journal. */
  readonly storage: SqliteStorage | null;
  /** The links between control planes on `hosts` and the engine: one more reason down, one less. */
  cut(id: string, hosts: readonly string[]): void;
  mend(id: string, hosts: readonly string[]): void;
}

export interface ControlPlanesOptions {
  /** A second control plane stands by (FleetOptions.standby). */
  standby: boolean;
  /** How long a journal commit takes, in ms; default: drawn per commit from 1 to 5. */
  commitMs?: number;
  /** How often the background canary runs, in ms; 0: none. */
  canaryEveryMs: number;
  outliers: boolean;
  admission: Admission;
  log: Logger;
}

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve = () => {};
  const promise = new Promise<void>((r) => {
    resolve = r;
  });
  return { promise, resolve };
}

export class ControlPlanes {
  /** The hosts control planes run on: one, or the leader's and the standby's. */
  readonly hosts: readonly string[];
  /** Why a control plane failed to start (each is a defect); its supervisor tries again a second later. */
  readonly startFailures: string[] = [];
  /** The hosts whose control plane found itself deposed and exited, in order. */
  readonly deposed: string[] = [];
  /** Processes that do not lead: standing by, or deposed and not yet exited. */
  private readonly others = new Set<{ host: string; process: ProcessClock }>();
  private readonly listeners = new Set<() => void>();
  /** Processes started so far. */
  private generation = 0;
  private current: SimControl | null = null;
  /** Why the disk refuses writes (a fault), for every journal opened on it; null: it takes them. */
  private diskFull: string | null = null;
  private stopping = false;

  constructor(
    private readonly fleet: ControlPlanesHost,
    private readonly options: ControlPlanesOptions,
  ) {
    this.hosts = options.standby ? ['control-a', 'control-b'] : ['control'];
  }

  /** The first control plane, leading; with a standby, the other one waiting. */
  async startFirst(): Promise<void> {
    await this.start(this.hosts[0] as string);
    if (this.options.standby) this.restart(this.hosts[1] as string);
  }

  /** The leading process (the last one, while it is down). */
  get live(): SimControl {
    if (!this.current) throw new Error('the control plane is not running');
    return this.current;
  }

  /** Calls `fn` each time a control-plane process has started (after the first). */
  onStarted(fn: () => void): void {
    this.listeners.add(fn);
  }

  /** The disk refuses writes with `why` (a full disk), for this journal and the next; null: it takes them. */
  refuseWrites(why: string | null): void {
    this.diskFull = why;
    const { journal } = this.live;
    if (journal instanceof MemoryJournal) journal.refuseWrites(why);
    else this.fleet.storage?.refuseWrites(why);
  }

  /**
   * A control-plane process on `host`: the journal opened on the fleet's disk (it is embedded, as
   * SQLite is; with a standby, it first waits to lead it), `ControlPlane.start` on it, the
   * watchdog and the ladder — whose supervisor is the fleet.
   */
  private async start(host: string): Promise<void> {
    const { clock, random, network, disk, storage } = this.fleet;
    const { options } = this;
    const { log } = options;
    const process = new ProcessClock(clock);
    // A restarted control plane draws from streams of its own, as a new process would.
    const n = this.generation++;
    const ids = seededIds(clock, random.fork(n === 0 ? 'control ids' : `control ids ${n}`));
    const disks = random.fork(n === 0 ? 'disk' : `disk ${n}`);
    const commitMs = options.commitMs ?? (() => disks.between(1, 5));
    const opened = { disk, clock: process, ids, commitMs };
    let journal: MemoryJournal | JournalStore;
    if (storage !== null) journal = await storage.open(process, ids, log);
    else if (options.standby) {
      const waiting = { host, process };
      this.others.add(waiting);
      journal = await MemoryJournal.standBy({
        ...opened,
        lead: { holder: host, leaseMs: CONTROL_LEASE_MS },
      });
      this.others.delete(waiting);
    } else journal = MemoryJournal.open(opened);
    if (journal instanceof MemoryJournal) journal.refuseWrites(this.diskFull);
    const control = await ControlPlane.start({
      journal,
      admission: options.admission,
      log,
      version: 'sim',
      bus: controlEndpoint(host),
      curve: false,
      clock: process,
      ids,
      transport: network.host(host),
      model: new DeterministicModel({}, process),
      // A state checkpoint every few hundred events, so a restart here starts from one; with
      // retention, every second too — as in production, where one is at most 60 s old and the
      // horizon at least 5 min, no room is pruned with events a restart's checkpoint lacks.
      checkpointEveryEvents: 200,
      ...(storage !== null ? { checkpointEveryMs: SIM_CHECKPOINT_EVERY_MS } : {}),
    });
    const watchdog = new Watchdog(control, journal, log, 100, process);
    watchdog.start();
    const ladder = new EscalationLadder(control, journal, this.fleet, log, {}, process);
    ladder.start();
    // As `pdctl serve` runs them (app/serving.ts, app/stack.ts).
    const canary = new Canary(control, log, 2000, process);
    if (options.canaryEveryMs > 0) canary.start(options.canaryEveryMs);
    const outliers = new OutlierDetector(control, journal, log, {}, process, ladder);
    if (options.outliers) outliers.start();
    const retention = storage?.retention(log, process) ?? null;
    retention?.start();
    const flow = new FlowControl(
      {
        clock: process,
        submit: (r) => control.submit(r),
        tokenize: (p) => control.modelInfo.tokenize(p),
      },
      FLOW_DEFAULTS,
    );
    control.onRoomEvent(() => flow.wake());
    const c: SimControl = {
      host,
      process,
      frozen: 0,
      died: deferred(),
      journal,
      retention,
      control,
      watchdog,
      ladder,
      canary,
      outliers,
      flow,
    };
    // As `pdctl serve` does, a leader that finds another took the journal exits (code 3), and is
    // started again as a standby.
    if (journal instanceof MemoryJournal) journal.onDeposed(() => this.exitDeposed(c));
    // The leader it replaced, if its process lives on (stopped), finds itself deposed when it runs.
    if (this.current?.process.alive) this.others.add(this.current);
    this.current = c;
    for (const started of this.listeners) started();
  }

  private restart(host: string): void {
    if (this.stopping) return;
    this.start(host).catch((err: Error) => {
      this.startFailures.push(err.message);
      this.fleet.clock.setTimeout(() => this.restart(host), 1000);
    });
  }

  /** The deposed leader's process exits; it is started again, to stand by, a moment later. */
  private exitDeposed(c: SimControl): void {
    if (!c.process.alive) return;
    this.deposed.push(c.host);
    this.others.delete(c);
    this.end(c);
    this.fleet.clock.setTimeout(() => this.restart(c.host), REJOIN_MS);
  }

  /** The process ends at once: its timers, its sockets, its journal's commits in flight. */
  private end(c: SimControl): void {
    // A stopped process dies too: the new one is not stopped.
    if (c.frozen > 0) {
      c.frozen = 0;
      for (const id of this.fleet.ids()) this.fleet.mend(id, [c.host]);
    }
    c.process.kill();
    this.fleet.network.kill(c.host);
    if (c.journal instanceof MemoryJournal) c.journal.crash();
    else void this.fleet.storage?.crashed();
    c.died.resolve();
  }

  /**
   * SIGKILL of the leading control plane (deployed apart from its engines, which live on): its
   * timers and sockets end at once, and its journal's commits in flight are lost; what committed
   * stays on the disk. It starts again `restartMs` later on that disk, and the engines reconnect
   * — with a standby, the standby takes over meanwhile, and the killed one comes back to stand by.
   */
  kill(restartMs: number): void {
    const c = this.live;
    if (!c.process.alive) return;
    this.end(c);
    this.fleet.clock.setTimeout(() => this.restart(c.host), restartMs);
  }

  /**
   * SIGSTOP to the leading control plane: its timers, commits, messages and clients' requests
   * wait. Freezes that overlap hold it until the last of them ends. Returns its SIGCONT: what fell
   * due meanwhile runs at once, as for a real process — one that was killed meanwhile stays dead,
   * and one a standby replaced meanwhile finds itself deposed.
   */
  freeze(): () => void {
    const c = this.current;
    if (!c?.process.alive) return () => {};
    if (c.frozen++ === 0) {
      c.process.freeze();
      for (const id of this.fleet.ids()) this.fleet.cut(id, [c.host]);
    }
    return () => {
      if (!c.process.alive || c.frozen === 0 || --c.frozen > 0) return;
      for (const id of this.fleet.ids()) this.fleet.mend(id, [c.host]);
      c.process.thaw();
    };
  }

  /** Runs `fn` in the leading process: now, or once it runs again if it is stopped. */
  inControl(fn: () => void): void {
    const c = this.live;
    if (c.frozen > 0) c.process.defer(fn);
    else fn();
  }

  /** The run ends: standbys, and a deposed leader still stopped, end with it; none starts again. */
  stopOthers(): void {
    this.stopping = true;
    for (const other of this.others) other.process.kill();
    this.others.clear();
  }
}
