/**
 * Spawns engine processes as children of the control plane and keeps them running: an engine
 * that exits unexpectedly is started again (with backoff), under the same id, so it reconnects
 * and replays its rooms from the journal. SIGTERM on stop; SIGKILL for what does not exit.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, openSync, readdirSync, readSync, statSync } from 'node:fs';
import type { Admission } from '../bus/admission.ts';
import type { Logger } from '../log.ts';
import { isAlive } from '../pids.ts';
import { defaultPoolName, KvPool } from '../transfer/pool.ts';
import { selfCommand } from './self.ts';

/**
 * Removes KV pools in /dev/shm that engines of this user left behind when they were killed: a
 * `pdctl-<id>-<pid>` name whose pid is no longer running. A live engine's pool is never touched.
 * Returns the names removed.
 */
/** The first bytes of every pool's header (native/src/pool.h, kPoolMagic). */
const POOL_MAGIC = Buffer.from('PDKVPOOL', 'latin1');

function isPool(path: string): boolean {
  const fd = openSync(path, 'r');
  try {
    const head = Buffer.alloc(POOL_MAGIC.length);
    return readSync(fd, head, 0, head.length, 0) === head.length && head.equals(POOL_MAGIC);
  } finally {
    closeSync(fd);
  }
}

export function removeDeadEnginePools(dir = '/dev/shm'): string[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch {
    return [];
  }
  const removed: string[] = [];
  const uid = process.getuid?.();
  for (const name of names) {
    const m = /^pdctl-.+-(\d+)$/.exec(name);
    if (!m) continue;
    const pid = Number(m[1]);
    if (pid === process.pid || isAlive(pid)) continue;
    try {
      const path = `${dir}/${name}`;
      if (uid !== undefined && statSync(path).uid !== uid) continue;
      // Only a pdctl KV pool (its header starts with the pool magic), never another object that
      // happens to share the naming pattern.
      if (!isPool(path)) continue;
      if (KvPool.unlink(`/${name}`)) removed.push(name);
    } catch {
      // Gone meanwhile, or not ours to remove.
    }
  }
  return removed;
}

export interface EngineSpec {
  id: string;
  role: 'prefill' | 'decode';
  /** Extra `pdctl engine` flags, e.g. ['--pages', '1024']. */
  args: string[];
}

export interface SupervisorOptions {
  control: string;
  /**
   * Gives each engine its own key pair (in its environment, never on its command line), allowed
   * for its id only; a restarted engine gets the same pair.
   */
  admission: Admission;
  /** The bus uses CURVE (false: engines are started with `--insecure-bus`). */
  curve: boolean;
  log: Logger;
  /** Engines' log level (their logs go to this process's stderr). */
  logLevel: string;
  /** Restart an engine that exits on its own. Default true. */
  restart?: boolean;
  env?: NodeJS.ProcessEnv;
  /**
   * The pdctl entry engines are started with: the compiled `bin/pdctl.js` for a stack that runs
   * from source (tests: an engine then starts as an installed one does, without compiling its
   * TypeScript first). Default: this process's own build (`self.ts`).
   */
  entry?: string;
  /**
   * A crash loop: more than this many unexpected exits of one engine within `crashWindowMs` and it
   * is not started again (an operator is needed). Default 5 in 10 min.
   */
  maxCrashes?: number;
  crashWindowMs?: number;
  /** How long `stop()` waits for its engines to exit before it kills them. Default 15 s. */
  stopTimeoutMs?: number;
  /** Leave a dead engine's pool name in /dev/shm (tests that inspect it). Default false. */
  keepPools?: boolean;
  /** Told when an engine is given up on for crash-looping. */
  onGiveUp?: (id: string, reason: string) => void;
  /**
   * Told of every engine process that exits, however it ended (the control plane migrates its
   * rooms and journals the exit), with how many times that engine was started again before.
   */
  onExit?: (id: string, pid: number | undefined, status: ExitStatus, restarts: number) => void;
}

/**
 * How an engine process ended, as a metric label: `killed` (SIGKILL: the OOM killer, kill -9),
 * `signal` (any other signal), `error` (a non-zero exit code), `clean` (exit 0 on its own),
 * `replaced` (pdctl killed it to start it again), `stopped` (pdctl was shutting down).
 */
export const EXIT_CAUSES = [
  'killed',
  'signal',
  'error',
  'clean',
  'replaced',
  'retired',
  'stopped',
] as const;
export type ExitCause = (typeof EXIT_CAUSES)[number];

/** Who started an engine again: the supervisor after an exit, or the escalation ladder. */
export const RESTARTERS = ['supervisor', 'ladder'] as const;
export type Restarter = (typeof RESTARTERS)[number];

/** An engine's exits by cause and restarts by who, since this process started (every one at 0 first). */
export interface EngineTallies {
  exits: Record<ExitCause, number>;
  restarts: Record<Restarter, number>;
}

function exitCause(status: ExitStatus, stopping: boolean, retiring: boolean): ExitCause {
  if (stopping) return 'stopped';
  if (retiring) return 'retired';
  if (status.expected) return 'replaced';
  if (status.signal === 'SIGKILL') return 'killed';
  if (status.signal) return 'signal';
  return status.code === 0 ? 'clean' : 'error';
}

interface Child {
  spec: EngineSpec;
  process: ChildProcess;
  restarts: number;
  exited: Promise<ExitStatus>;
  /** Being replaced by restartNow: its exit starts nothing by itself. */
  replacing?: boolean;
  /** Retired (the planner's step down): its exit is expected and starts nothing. */
  retiring?: boolean;
}

export interface ExitStatus {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** pdctl ended it (stopping, or restartNow); false: it died on its own. */
  expected?: boolean;
}

/** The supervisor's timings where its options leave them out. */
export const SUPERVISOR_DEFAULTS = Object.freeze({
  maxCrashes: 5,
  crashWindowMs: 600_000,
  stopTimeoutMs: 15_000,
  /** An engine that exited on its own is started again after this, doubling with each restart… */
  restartBaseMs: 200,
  /** …up to this. */
  restartMaxMs: 5_000,
});

/** How long an engine that exited on its own waits to be started again: 200 ms, doubling, up to 5 s. */
export function restartDelayMs(restarts: number): number {
  const { restartBaseMs, restartMaxMs } = SUPERVISOR_DEFAULTS;
  return Math.min(restartMaxMs, restartBaseMs * 2 ** Math.min(restarts, 5));
}

/**
 * What the escalation ladder asks of whoever runs the engine processes (the supervisor port):
 * `pdctl serve`'s `EngineSupervisor` over child processes, the simulator's fleet over simulated
 * ones (sim/fleet.ts).
 */
export interface Supervisor {
  /** The engine's current process, if this supervisor runs it. */
  pid(id: string): number | undefined;
  /** Sends a signal to the engine's process; false if there is none. */
  signal(id: string, sig: NodeJS.Signals): boolean;
  /** The engines it runs. */
  ids(): string[];
  /** Kills the engine's process and starts it again; resolves with the new pid. */
  restartNow(id: string): Promise<number | undefined>;
}

export class EngineSupervisor implements Supervisor {
  private readonly children = new Map<string, Child>();
  /** Unexpected exits per engine, newest last (unix ms), for the crash-loop cap. */
  private readonly crashes = new Map<string, number[]>();
  private readonly tallies = new Map<string, EngineTallies>();
  private stopping = false;

  constructor(private readonly options: SupervisorOptions) {}

  /** Starts an engine process; `by`: who starts it again (absent: its first start). */
  start(spec: EngineSpec, restarts = 0, by?: Restarter): ChildProcess {
    const tally = this.tallyOf(spec.id);
    if (by) tally.restarts[by]++;
    const self = selfCommand(
      [
        'engine',
        '--role',
        spec.role,
        '--id',
        spec.id,
        '--control',
        this.options.control,
        '--log-level',
        this.options.logLevel,
        ...(this.options.curve ? [] : ['--insecure-bus']),
        ...spec.args,
      ],
      this.options.entry,
    );
    const child = spawn(self.command, self.args, {
      stdio: ['ignore', 'inherit', 'inherit'],
      env: {
        ...process.env,
        ...this.options.env,
        ...this.options.admission.engineEnv(spec.id),
        // An engine never outlives the process that spawned it (it checks every second).
        PDCTL_EXIT_WITH_PARENT: String(process.pid),
      },
    });
    const exited = new Promise<ExitStatus>((resolve) => {
      child.once('exit', (code, signal) => {
        resolve({ code, signal });
        this.onExit(spec, child, code, signal);
      });
    });
    this.children.set(spec.id, { spec, process: child, restarts, exited });
    this.options.log.info(
      { engine: spec.id, role: spec.role, enginePid: child.pid },
      'engine process started',
    );
    return child;
  }

  private onExit(
    spec: EngineSpec,
    child: ChildProcess,
    code: number | null,
    signal: NodeJS.Signals | null,
  ): void {
    const entry = this.children.get(spec.id);
    // Its pool's name goes with it (open mappings elsewhere stay valid): a SIGKILLed engine
    // cannot unlink it itself, and /dev/shm would fill with dead engines' pools.
    if (child.pid !== undefined && !this.options.keepPools) {
      try {
        KvPool.unlink(defaultPoolName(spec.id, child.pid));
      } catch (err) {
        this.options.log.warn({ err, engine: spec.id }, 'could not unlink a dead engine’s pool');
      }
    }
    try {
      const mine = entry?.process === child;
      const expected =
        this.stopping || (mine && (entry?.replacing === true || entry?.retiring === true));
      const retired = mine && entry?.retiring === true;
      this.tallyOf(spec.id).exits[exitCause({ code, signal, expected }, this.stopping, retired)]++;
      this.options.onExit?.(
        spec.id,
        child.pid,
        { code, signal, expected },
        mine ? entry.restarts : 0,
      );
    } catch (err) {
      this.options.log.error({ err, engine: spec.id }, 'exit listener threw');
    }
    if (!entry || entry.process !== child || entry.replacing) return;
    if (this.stopping || this.options.restart === false || entry.retiring) {
      this.children.delete(spec.id);
      return;
    }
    const now = Date.now();
    const window = this.options.crashWindowMs ?? SUPERVISOR_DEFAULTS.crashWindowMs;
    const recent = [...(this.crashes.get(spec.id) ?? []), now].filter((t) => now - t < window);
    this.crashes.set(spec.id, recent);
    if (recent.length > (this.options.maxCrashes ?? SUPERVISOR_DEFAULTS.maxCrashes)) {
      const reason = `crash loop: ${recent.length} exits in ${Math.round(window / 1000)} s (last: ${signal ?? `code ${code}`})`;
      this.options.log.error(
        { engine: spec.id, enginePid: child.pid, code, signal },
        `engine ${spec.id} is crash-looping; not restarting it again — see its log above, fix, and restart pdctl`,
      );
      this.children.delete(spec.id);
      this.options.onGiveUp?.(spec.id, reason);
      return;
    }
    const delay = restartDelayMs(entry.restarts);
    this.options.log.error(
      { engine: spec.id, enginePid: child.pid, code, signal, restartInMs: delay },
      'engine process exited; restarting it',
    );
    setTimeout(() => {
      if (!this.stopping && this.children.get(spec.id)?.process === child)
        this.start(spec, entry.restarts + 1, 'supervisor');
    }, delay).unref();
  }

  /**
   * Replaces one engine process now: SIGKILL (a wedged process cannot drain), wait for it to go,
   * start it again under the same id. The new incarnation replays its rooms from the journal.
   * Resolves with the new pid, or undefined if there was no such engine or we are stopping.
   */
  async restartNow(id: string): Promise<number | undefined> {
    const entry = this.children.get(id);
    if (!entry || this.stopping) return undefined;
    entry.replacing = true;
    entry.process.kill('SIGKILL');
    await entry.exited;
    if (this.stopping) return undefined;
    return this.start(entry.spec, entry.restarts + 1, 'ladder').pid;
  }

  /**
   * Ends one engine for good (the planner retires it): SIGTERM, and SIGKILL if it has not gone
   * within `timeoutMs`; its exit is expected and it is not started again. Resolves once it has
   * exited; false when there was no such engine.
   */
  async retire(id: string, timeoutMs: number): Promise<boolean> {
    const entry = this.children.get(id);
    if (!entry) return false;
    entry.retiring = true;
    entry.process.kill('SIGTERM');
    const timer = setTimeout(() => entry.process.kill('SIGKILL'), timeoutMs);
    await entry.exited;
    clearTimeout(timer);
    return true;
  }

  /** The engines this supervisor runs. */
  ids(): string[] {
    return [...this.children.keys()];
  }

  /** How the engine's current process ends (resolves when it exits). */
  exited(id: string): Promise<ExitStatus> | undefined {
    return this.children.get(id)?.exited;
  }

  /** How many times this engine's process was started again (after a crash, or by the ladder). */
  restarts(id: string): number | null {
    return this.children.get(id)?.restarts ?? null;
  }

  /** Every engine this supervisor ever started, with its exits and restarts (a copy). */
  talliesAll(): Map<string, EngineTallies> {
    return new Map(
      [...this.tallies].map(([id, t]) => [
        id,
        { exits: { ...t.exits }, restarts: { ...t.restarts } },
      ]),
    );
  }

  private tallyOf(id: string): EngineTallies {
    let t = this.tallies.get(id);
    if (!t) {
      t = {
        exits: Object.fromEntries(EXIT_CAUSES.map((c) => [c, 0])) as EngineTallies['exits'],
        restarts: Object.fromEntries(RESTARTERS.map((r) => [r, 0])) as EngineTallies['restarts'],
      };
      this.tallies.set(id, t);
    }
    return t;
  }

  pid(id: string): number | undefined {
    return this.children.get(id)?.process.pid;
  }

  /** Sends a signal to one engine (drills and tests: SIGKILL, SIGSTOP). */
  signal(id: string, sig: NodeJS.Signals): boolean {
    return this.children.get(id)?.process.kill(sig) ?? false;
  }

  /** SIGTERM to every engine (they drain), SIGKILL to those still running after `timeoutMs`. */
  async stop(
    timeoutMs = this.options.stopTimeoutMs ?? SUPERVISOR_DEFAULTS.stopTimeoutMs,
  ): Promise<void> {
    this.stopping = true;
    const all = [...this.children.values()];
    for (const c of all) c.process.kill('SIGTERM');
    const timer = setTimeout(() => {
      for (const c of all)
        if (c.process.exitCode === null && c.process.signalCode === null) c.process.kill('SIGKILL');
    }, timeoutMs);
    await Promise.all(all.map((c) => c.exited));
    clearTimeout(timer);
    this.children.clear();
  }
}
