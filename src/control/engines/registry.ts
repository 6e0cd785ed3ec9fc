/**
 * The engines the control plane knows: who each is (role, incarnation, pool), which bus peer
 * speaks for it, what its last heartbeat said, and the pages promised to it. Picking a pair for
 * a new room is control/intake/pairs.ts's, among the candidates found here; a cordoned engine (cordons.ts)
 * is never one, nor an ejected one (ejections.ts) but for the canary that may bring it back.
 */

import { type Clock, systemClock } from '../../ports/clock.ts';
import { ControlError } from '../errors.ts';
import { Cordons } from '../evidence/cordons.ts';
import { Ejections } from '../evidence/ejections.ts';
import type { EngineSession } from './engine-session.ts';
import { type EngineStatus, engineStatus, type LivenessPolicy } from './engine-view.ts';

export class EngineRegistry {
  private readonly sessions = new Map<string, EngineSession>();
  /** Engines that take no new rooms until an operator uncordons them, registered or not. */
  readonly cordons: Cordons;
  /** Engines out of rotation as outliers until a canary through them passes. */
  readonly ejections = new Ejections();
  /**
   * Engines being retired (the planner's step down, app/fleet-actions.ts): no new rooms from the
   * moment they are added, whatever their heartbeat says; dropped with the engine.
   */
  readonly retiring = new Set<string>();

  constructor(readonly clock: Clock = systemClock) {
    this.cordons = new Cordons(clock);
  }

  get(engine: string): EngineSession | undefined {
    return this.sessions.get(engine);
  }

  set(session: EngineSession): void {
    this.sessions.set(session.engine, session);
  }

  delete(engine: string): void {
    this.sessions.delete(engine);
    this.retiring.delete(engine);
  }

  all(): EngineSession[] {
    return [...this.sessions.values()];
  }

  /** Engines not heard from for `ms`. */
  silent(ms: number, now = this.clock.now()): EngineSession[] {
    return [...this.sessions.values()].filter((s) => now - s.health.lastSeen >= ms);
  }

  /** Engines of the role whose status (engine-view.ts, by heartbeat) is `status` now. */
  withStatus(
    role: 'prefill' | 'decode',
    status: EngineStatus,
    policy: Readonly<LivenessPolicy>,
    now = this.clock.now(),
  ): EngineSession[] {
    return [...this.sessions.values()].filter(
      (s) => s.role === role && engineStatus(s, policy, now) === status,
    );
  }

  /**
   * Engines of the role that may take a new room now: live (above), not cordoned, not being
   * retired, not ejected, passing `usable`. `probe`: a canary for this engine, ejected or not — for its role, only it.
   */
  candidates(
    role: 'prefill' | 'decode',
    policy: Readonly<LivenessPolicy>,
    now = this.clock.now(),
    usable: (s: EngineSession) => boolean = () => true,
    probe: string | null = null,
  ): EngineSession[] {
    const probed = probe === null ? undefined : this.sessions.get(probe);
    const open = (s: EngineSession) => !this.cordons.has(s.engine) && !this.retiring.has(s.engine);
    return this.withStatus(role, 'live', policy, now).filter((s) =>
      probed?.role === role
        ? s === probed && open(s) && usable(s)
        : open(s) && !this.ejections.has(s.engine) && usable(s),
    );
  }

  /** Resolves once `prefill` and `decode` engines are registered and past their replay. */
  async waitFor(prefill: number, decode: number, timeoutMs: number): Promise<void> {
    const deadline = this.clock.now() + timeoutMs;
    for (;;) {
      const live = this.all().filter((s) => s.delivery.live);
      const p = live.filter((s) => s.role === 'prefill').length;
      const d = live.filter((s) => s.role === 'decode').length;
      if (p >= prefill && d >= decode) return;
      if (this.clock.now() > deadline) {
        throw new ControlError(
          'CONTROL_ENGINES_TIMEOUT',
          `only ${p}/${prefill} prefill and ${d}/${decode} decode engines registered within ${timeoutMs} ms; check the engines' logs above`,
        );
      }
      await new Promise<void>((r) => this.clock.setTimeout(r, 50));
    }
  }
}
