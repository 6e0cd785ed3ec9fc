/**
 * The whole stack on one machine: the journal, a control plane and its engine processes, with the
 * recovery that watches them (watchdog, escalation ladder, supervisor). `pdctl run`, `pdctl serve`
 * (through serving.ts), the drills, the end-to-end tests and `bench:engines` all start it here.
 */
import { Admission, needsCurve } from '../bus/admission.ts';
import { ControlPlane } from '../control/control-plane.ts';
import type { ControlPlaneOptions } from '../control/options.ts';
import { PACK_AFTER_MS } from '../journal/packs.ts';
import { Retention, type RetentionPolicy } from '../journal/retention.ts';
import { SCAN_LATER_ABOVE_BYTES } from '../journal/sqlite/journal.ts';
import type { Durability } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { Planner, type PlannerOptions } from '../planner/online.ts';
import { stepTimer, systemClock } from '../ports/clock.ts';
import { engineExited } from '../recovery/exits.ts';
import { EscalationLadder } from '../recovery/ladder.ts';
import type { LadderPolicy } from '../recovery/ladder-decide.ts';
import { OutlierDetector, type OutlierPolicy } from '../recovery/outliers.ts';
import { EngineSupervisor, removeDeadEnginePools } from '../recovery/supervisor.ts';
import type { RecoveryView } from '../recovery/view.ts';
import { Watchdog } from '../recovery/watchdog.ts';
import { FleetActions } from './fleet-actions.ts';
import { type ControlJournal, type JournalOpenOptions, openJournal } from './journal.ts';

/** A control plane on a journal: what `openControlPlane` and the stack start from. */
export interface ControlPlaneOnDisk extends Omit<ControlPlaneOptions, 'journal'> {
  /** A SQLite file or a postgres:// URL. */
  journalPath: string;
  durability?: Durability;
  /** PostgreSQL: who this control plane is and whether it waits as a standby (app/journal.ts). */
  leadership?: JournalOpenOptions['leadership'];
  /** Prune the journal while serving (`--retain`); absent: it keeps everything. */
  retention?: RetentionPolicy;
  /**
   * SQLite: open the journal with its fault hooks, for drills and tests that fill its disk or
   * crash its writer (journal/sqlite/faults.ts). `pdctl serve` never does.
   */
  journalFaults?: boolean;
}

/**
 * Packing pays where a room stays long after it is packed. Under a horizon shorter than this, most
 * rooms would be packed and then pruned minutes later: the writer's time spent twice for bytes
 * that are about to go.
 */
export const PACK_MIN_RETAIN_MS = 3 * PACK_AFTER_MS;

/** How long after it ends a room is packed under this retention; undefined: rooms are not packed. */
export function packAfterFor(retention: RetentionPolicy | undefined): number | undefined {
  if (retention !== undefined && retention.roomsMs < PACK_MIN_RETAIN_MS) return undefined;
  return PACK_AFTER_MS;
}

/**
 * How long a big journal's after-start scan (`quick_check`) waits for the stack to be ready before
 * it starts anyway: on two cores, a scan beside the engines' start delayed it by ~0.5 s.
 */
const SCAN_AFTER_OPEN_MS = 10_000;

/**
 * Opens the journal file and starts a control plane on it (no engines): the control plane owns
 * the journal from then on and drains it when closed.
 */
export async function openControlPlane(
  options: ControlPlaneOnDisk,
): Promise<{ control: ControlPlane; journal: ControlJournal }> {
  const { took, time } = stepTimer(options.clock ?? systemClock);
  const journal = await time('journalOpenMs', () =>
    openJournal({
      path: options.journalPath,
      durability: options.durability,
      log: options.log,
      leadership: options.leadership,
      announce: { source: 'control', version: options.version },
      // A control plane starts on a big journal without waiting for a read of every page, and
      // the read waits until serving is ready (startServing) rather than slow the engines' start.
      scanLaterAbove: SCAN_LATER_ABOVE_BYTES,
      scanAfterMs: SCAN_AFTER_OPEN_MS,
      // Rooms that ended are packed a row each once their releases are in.
      packAfterMs: packAfterFor(options.retention),
      ...(options.journalFaults ? { faults: true } : {}),
    }),
  );
  // On failure, start drains the journal it was given.
  const control = await ControlPlane.start({ ...options, journal });
  control.startup = { ...control.startup, took: { ...took, ...control.startup.took } };
  return { control, journal };
}

export interface StackOptions extends Omit<ControlPlaneOnDisk, 'admission'> {
  /** Default: a fresh key pair for the control plane; each spawned engine gets one of its own. */
  admission?: Admission;
  /** Engine processes to spawn. Default 1 and 1. */
  prefillEngines?: number;
  decodeEngines?: number;
  /** Extra `pdctl engine` flags for every spawned engine (pages, model knobs, …). */
  engineArgs?: string[];
  engineLogLevel?: string;
  /** How long to wait for the engines to register. Default 30 s. */
  readyTimeoutMs?: number;
  /** Restart engines that exit on their own. Default true. */
  restartEngines?: boolean;
  engineEnv?: NodeJS.ProcessEnv;
  /** The pdctl entry engines are started with (supervisor.ts `entry`). Default: this build's. */
  engineEntry?: string;
  /**
   * Fail rooms that overstay their state's deadline. Default true.
   */
  watchdog?: boolean;
  /**
   * Take stalled engines (bus loop not consuming, heartbeats stopped) up the escalation ladder:
   * reset in place, restart the engine, restart the stack. Default true.
   */
  restartStalled?: boolean;
  ladder?: Partial<LadderPolicy>;
  /**
   * Take engines whose rooms keep failing by their fault out of rotation until a canary through
   * them passes (recovery/outliers.ts). Default true.
   */
  outlierEjection?: boolean;
  outliers?: Partial<OutlierPolicy>;
  /** The planner (`--planner`, docs/planner.md); absent: off. Its budget defaults to the engines spawned. */
  planner?: PlannerOptions;
}

export interface Stack {
  control: ControlPlane;
  /** The control plane's journal; drills and tests reach its fault hooks through it. */
  journal: ControlJournal;
  /** Who may join the bus; add keys for engines started by hand with `admission.allow`. */
  admission: Admission;
  engines: EngineSupervisor;
  watchdog: Watchdog;
  ladder: EscalationLadder;
  outliers: OutlierDetector;
  /** Journal retention while serving, and the operator's prunes (journal/retention.ts). */
  retention: Retention;
  /** The planner's decisions each interval (planner/online.ts); mode `off` when it is not run. */
  planner: Planner;
  /** What carries out the planner's steps on this stack's engines (`--planner act`). */
  fleet: FleetActions;
  /** The ladder's view and restart count of each engine, for the API and `pdctl engines`. */
  recovery: RecoveryView;
  engineIds: { prefill: string[]; decode: string[] };
  /** Stops the engines (they drain), then the control plane. Idempotent. */
  stop(): Promise<void>;
}

export async function startStack(options: StackOptions): Promise<Stack> {
  const log: Logger = options.log;
  // Pools that engines of an earlier run left in /dev/shm when they were killed.
  const swept = removeDeadEnginePools();
  if (swept.length > 0) log.info({ pools: swept }, 'removed KV pools of dead engines');
  const admission = options.admission ?? new Admission();
  const curve = options.curve ?? needsCurve(options.bus ?? 'tcp://127.0.0.1:0');
  const { control, journal } = await openControlPlane({ ...options, admission, curve });
  const engines = new EngineSupervisor({
    control: control.endpoint,
    admission,
    curve,
    log,
    logLevel: options.engineLogLevel ?? 'warn',
    restart: options.restartEngines ?? true,
    env: options.engineEnv,
    ...(options.engineEntry ? { entry: options.engineEntry } : {}),
    onGiveUp: (id, reason) => {
      void journal
        .append({
          type: 'recovery.action',
          engine: id,
          source: 'supervisor',
          data: { action: 'give_up', reason, outcome: 'not restarted; an operator is needed' },
        })
        .catch((err) => log.error({ err, engine: id }, 'could not journal the give-up'));
      void actions.gaveUp(id, reason);
    },
    // Stopping: every engine exits on purpose, and nothing is left to continue its rooms on.
    onExit: (engine, pid, status, restarts) =>
      engineExited(
        control,
        journal,
        log,
        { engine, pid: pid ?? null, restarts, ...status, expected: status.expected === true },
        !stopping,
      ),
  });
  const ids = {
    prefill: Array.from({ length: options.prefillEngines ?? 1 }, (_, i) => `prefill-${i}`),
    decode: Array.from({ length: options.decodeEngines ?? 1 }, (_, i) => `decode-${i}`),
  };
  // Every engine a stack spawns is on this host: shared memory moves its KV, and no UCX worker
  // listens on the machine's interfaces (a later --kv-transport in engineArgs wins).
  const args = ['--kv-transport', 'shm', ...(options.engineArgs ?? [])];
  for (const id of ids.prefill) engines.start({ id, role: 'prefill', args });
  for (const id of ids.decode) engines.start({ id, role: 'decode', args });
  const watchdog = new Watchdog(control, journal, log);
  const ladder = new EscalationLadder(control, journal, engines, log, options.ladder);
  const outliers = new OutlierDetector(
    control,
    journal,
    log,
    options.outliers,
    systemClock,
    ladder,
  );
  const recovery: RecoveryView = {
    ladder: (engine) => ladder.view(engine),
    restarts: (engine) => engines.restarts(engine),
    tallies: () => engines.talliesAll(),
  };
  if (options.restartStalled !== false) ladder.start();
  if (options.watchdog !== false) watchdog.start();
  if (options.outlierEjection !== false) outliers.start();
  const retention = new Retention(journal, options.retention ?? null, log, systemClock);
  const { mode, ...plannerOptions }: PlannerOptions = options.planner ?? { mode: 'off' };
  const fleet = () => {
    const counts = { prefill: 0, decode: 0 };
    for (const e of control.engines()) counts[e.role]++;
    return counts;
  };
  const budget = plannerOptions.budget ?? ids.prefill.length + ids.decode.length;
  const actions = new FleetActions({ control, journal, engines, args, log });
  const planner = new Planner(
    journal,
    fleet,
    mode,
    { ...plannerOptions, budget },
    systemClock,
    log,
    actions,
  );
  let stopping: Promise<void> | null = null;
  const stop = () => {
    stopping ??= (async () => {
      watchdog.stop();
      ladder.stop();
      outliers.stop();
      actions.stop();
      await planner.stop();
      await retention.stop();
      await engines.stop();
      await control.close();
    })();
    return stopping;
  };
  try {
    await control.waitForEngines(
      ids.prefill.length,
      ids.decode.length,
      options.readyTimeoutMs ?? 30_000,
    );
  } catch (err) {
    await stop();
    throw err;
  }
  retention.start();
  await planner.start();
  return {
    control,
    journal,
    admission,
    engines,
    watchdog,
    ladder,
    outliers,
    retention,
    planner,
    fleet: actions,
    recovery,
    engineIds: ids,
    stop,
  };
}
