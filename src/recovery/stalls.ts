/**
 * The rung after failing overdue rooms (DESIGN.md §9): an engine whose bus loop stopped consuming
 * (the wedge of INCIDENT.md) or whose heartbeats stopped is declared stalled (`engine.stalled`)
 * and that one process is replaced (`recovery.action` restart_engine) — the rest of the stack,
 * the control plane and the other engines, keep serving. Back-off per engine, so a crash-looping
 * engine is not restarted more than once per `minIntervalMs`.
 */
import type { ControlPlane } from '../control/control-plane.ts';
import type { Logger } from '../log.ts';
import type { EngineSupervisor } from './supervisor.ts';

export interface StallPolicy {
  /** An engine behind on the events sent to it for this long. Default 1000 ms. */
  frozenMs: number;
  /** No heartbeat for this long. Default 5000 ms. */
  heartbeatStaleMs: number;
  /** At most one restart per engine per this long. Default 10 s. */
  minIntervalMs: number;
}

export const DEFAULT_STALL_POLICY: Readonly<StallPolicy> = Object.freeze({
  frozenMs: 1000,
  heartbeatStaleMs: 5000,
  minIntervalMs: 10_000,
});

export class StallRecovery {
  private readonly lastAction = new Map<string, number>();
  restarts = 0;

  constructor(
    private readonly control: ControlPlane,
    private readonly supervisor: EngineSupervisor,
    private readonly log: Logger,
    private readonly policy: StallPolicy = DEFAULT_STALL_POLICY,
  ) {}

  /** Checks every engine once; returns the engines it is restarting. */
  tick(now = Date.now()): string[] {
    const stalled = new Map<string, string>();
    for (const e of this.control.frozenEngines(this.policy.frozenMs, now)) {
      stalled.set(
        e,
        `bus loop consumed nothing for ${this.policy.frozenMs} ms after being sent events`,
      );
    }
    for (const s of this.control.registry.all()) {
      if (
        s.live &&
        now - s.lastSeen > this.policy.heartbeatStaleMs &&
        this.supervisor.pid(s.engine) !== undefined
      ) {
        stalled.set(s.engine, `no heartbeat for ${now - s.lastSeen} ms`);
      }
    }
    const acted: string[] = [];
    for (const [engine, reason] of stalled) {
      if (now - (this.lastAction.get(engine) ?? 0) < this.policy.minIntervalMs) continue;
      if (this.supervisor.pid(engine) === undefined) continue; // not ours to restart
      this.lastAction.set(engine, now);
      acted.push(engine);
      void this.restart(engine, reason, now);
    }
    return acted;
  }

  private async restart(engine: string, reason: string, detectedAt: number): Promise<void> {
    const journal = this.control.journal;
    this.log.error({ engine, reason }, 'engine stalled; restarting that one process');
    const note = (p: Promise<unknown>) =>
      p.catch((err) => this.log.error({ err, engine }, 'could not journal a recovery step'));
    await note(
      journal.append({ type: 'engine.stalled', engine, source: 'watchdog', data: { reason } }),
    );
    const pid = await this.supervisor.restartNow(engine);
    this.restarts++;
    await note(
      journal.append({
        type: 'recovery.action',
        engine,
        source: 'watchdog',
        data: {
          action: 'restart_engine',
          reason,
          outcome: pid === undefined ? 'not restarted (stopping)' : `restarted as pid ${pid}`,
          detectMs: Date.now() - detectedAt,
        },
      }),
    );
  }
}
