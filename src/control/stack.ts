/**
 * The whole stack on one machine: a control plane and its engine processes. `pdctl run`, `pdctl
 * serve`, the end-to-end tests and `bench:engines` all start it through here.
 */
import { Admission, needsCurve } from '../bus/admission.ts';
import type { Logger } from '../log.ts';
import { EscalationLadder, type LadderPolicy } from '../recovery/ladder.ts';
import { EngineSupervisor, removeDeadEnginePools } from '../recovery/supervisor.ts';
import { Watchdog } from '../recovery/watchdog.ts';
import { ControlPlane, type ControlPlaneOptions } from './control-plane.ts';

export interface StackOptions extends Omit<ControlPlaneOptions, 'admission'> {
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
}

export interface Stack {
  control: ControlPlane;
  /** Who may join the bus; add keys for engines started by hand with `admission.allow`. */
  admission: Admission;
  engines: EngineSupervisor;
  watchdog: Watchdog;
  ladder: EscalationLadder;
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
  const control = await ControlPlane.start({ ...options, admission, curve });
  const engines = new EngineSupervisor({
    control: control.endpoint,
    admission,
    curve,
    log,
    logLevel: options.engineLogLevel ?? 'warn',
    restart: options.restartEngines ?? true,
    env: options.engineEnv,
    onGiveUp: (id, reason) =>
      void control.journal
        .append({
          type: 'recovery.action',
          engine: id,
          source: 'supervisor',
          data: { action: 'give_up', reason, outcome: 'not restarted; an operator is needed' },
        })
        .catch((err) => log.error({ err, engine: id }, 'could not journal the give-up')),
    // A dead engine's rooms continue elsewhere at once, not when its replacement says hello.
    onExit: (id, pid, status, restarts) => {
      const s = control.registry.get(id);
      const held = s && s.pid === pid;
      control.journal
        .append({
          type: 'engine.exited',
          engine: id,
          source: 'supervisor',
          data: {
            pid: pid ?? 0,
            code: status.code,
            signal: status.signal,
            rooms: held ? s.liveRooms : 0,
            restarts,
            expected: status.expected === true,
          },
        })
        .catch((err) => log.error({ err, engine: id }, 'could not journal engine.exited'));
      if (!held) return;
      void control.engineLost(
        id,
        s.incarnation,
        `process ${pid} exited (${status.signal ?? `code ${status.code}`})`,
      );
    },
  });
  const ids = {
    prefill: Array.from({ length: options.prefillEngines ?? 1 }, (_, i) => `prefill-${i}`),
    decode: Array.from({ length: options.decodeEngines ?? 1 }, (_, i) => `decode-${i}`),
  };
  for (const id of ids.prefill)
    engines.start({ id, role: 'prefill', args: options.engineArgs ?? [] });
  for (const id of ids.decode)
    engines.start({ id, role: 'decode', args: options.engineArgs ?? [] });
  const watchdog = new Watchdog(control, log);
  const ladder = new EscalationLadder(control, engines, log, options.ladder);
  control.recoveryView = (engine) => ladder.view(engine);
  control.processRestarts = (engine) => engines.restarts(engine);
  if (options.restartStalled !== false) ladder.start();
  if (options.watchdog !== false) watchdog.start();
  let stopping: Promise<void> | null = null;
  const stop = () => {
    stopping ??= (async () => {
      watchdog.stop();
      ladder.stop();
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
  return { control, admission, engines, watchdog, ladder, engineIds: ids, stop };
}
