/**
 * The whole stack on one machine: a control plane and its engine processes. `pdctl run`, `pdctl
 * serve`, the end-to-end tests and `bench:engines` all start it through here.
 */
import type { Logger } from '../log.ts';
import { StallRecovery } from '../recovery/stalls.ts';
import { EngineSupervisor } from '../recovery/supervisor.ts';
import { Watchdog } from '../recovery/watchdog.ts';
import { ControlPlane, type ControlPlaneOptions } from './control-plane.ts';

export interface StackOptions extends ControlPlaneOptions {
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
  /** Restart an engine process whose bus loop stopped consuming or whose heartbeats stopped. Default true. */
  restartStalled?: boolean;
}

export interface Stack {
  control: ControlPlane;
  engines: EngineSupervisor;
  watchdog: Watchdog;
  stalls: StallRecovery;
  engineIds: { prefill: string[]; decode: string[] };
  /** Stops the engines (they drain), then the control plane. Idempotent. */
  stop(): Promise<void>;
}

export async function startStack(options: StackOptions): Promise<Stack> {
  const log: Logger = options.log;
  const control = await ControlPlane.start(options);
  const engines = new EngineSupervisor({
    control: control.endpoint,
    log,
    logLevel: options.engineLogLevel ?? 'warn',
    restart: options.restartEngines ?? true,
    env: options.engineEnv,
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
  const stalls = new StallRecovery(control, engines, log);
  const stallTimer = setInterval(() => stalls.tick(), 250);
  stallTimer.unref();
  if (options.restartStalled === false) clearInterval(stallTimer);
  if (options.watchdog !== false) watchdog.start();
  let stopping: Promise<void> | null = null;
  const stop = () => {
    stopping ??= (async () => {
      watchdog.stop();
      clearInterval(stallTimer);
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
  return { control, engines, watchdog, stalls, engineIds: ids, stop };
}
