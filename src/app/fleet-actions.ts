/**
 * The planner's steps carried out on the engines `pdctl serve` supervises (`--planner act`): an
 * engine started, an engine retired — drained first, so that no request fails — or both, for a
 * change of role. Each state is journaled (`engine.lifecycle`): `started`; `draining` → `drained`
 * → `stopped`. A retiring engine's rooms whose prefill has not begun move to other pairs when its
 * drain starts (`room.migrated`, `engine_retiring`); rooms still running on it at the drain
 * deadline move when it stops, as after any engine's exit (recovery/exits.ts).
 *
 * An engine it started that crash-loops (the supervisor gives up on it: `gaveUp`) is written off:
 * journaled `stopped`, forgotten, its id never used again, and no engine of its role is started
 * for the supervisor's crash window — what made it crash (its flags, its host) would make the
 * next one crash too.
 */
import type { ControlPlane } from '../control/control-plane.ts';
import type { EngineView } from '../control/engines/engine-view.ts';
import type { JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import type { Step } from '../planner/model.ts';
import type { PlannerActions } from '../planner/online.ts';
import type { Role } from '../planner/record.ts';
import { type EngineSupervisor, SUPERVISOR_DEFAULTS } from '../recovery/supervisor.ts';
import type { EventData } from '../room/events.ts';
import type { Room } from '../room/reducer.ts';

export interface FleetActionsDeps {
  control: ControlPlane;
  journal: Pick<JournalStore, 'append'>;
  engines: EngineSupervisor;
  /** The `pdctl engine` flags every engine the stack starts gets. */
  args: string[];
  log: Logger;
  /** How long a retiring engine gets to finish its rooms. Default 30 000. */
  drainDeadlineMs?: number;
  /** How long a new engine gets to register. Default 30 000. */
  startTimeoutMs?: number;
  /**
   * After an engine it started crash-looped, how long no other of its role is started: the
   * supervisor's crash window by default.
   */
  holdAfterCrashLoopMs?: number;
}

type Lifecycle = EventData<'engine.lifecycle'>;

const POLL_MS = 100;

export class FleetActions implements PlannerActions {
  private stopping = false;
  /** Engines it started, by id, still supervised. */
  private readonly mine = new Map<string, Role>();
  /** Ids of engines it wrote off (a crash loop): never given to another engine. */
  private readonly writtenOff = new Set<string>();
  /** Per role, starts held after a crash loop: until when, and whether the wait was logged. */
  private readonly held = new Map<Role, { until: number; engine: string; logged: boolean }>();

  constructor(private readonly deps: FleetActionsDeps) {}

  async step(step: Step): Promise<void> {
    switch (step) {
      case 'prefill_short':
      case 'decode_short':
        return this.start(step === 'prefill_short' ? 'prefill' : 'decode', step);
      case 'prefill_idle':
      case 'decode_idle':
        await this.retire(step === 'prefill_idle' ? 'prefill' : 'decode', step);
        return;
      case 'rebalance_to_prefill':
      case 'rebalance_to_decode': {
        // A change of role: one engine of the other role retired, one of this role in its place.
        const role: Role = step === 'rebalance_to_prefill' ? 'prefill' : 'decode';
        const retired = await this.retire(role === 'prefill' ? 'decode' : 'prefill', step);
        if (retired !== null) await this.start(role, step, retired);
        return;
      }
    }
  }

  /** Ends the waits of a step being carried out (the stack is stopping). */
  stop(): void {
    this.stopping = true;
  }

  /**
   * Starts an engine of `role` under a new id (in place of `replaces`, retired for a change of
   * role); resolves once it registered, was written off, or its wait ran out.
   */
  private async start(role: Role, reason: string, replaces?: string): Promise<void> {
    if (this.stopping || this.holding(role, reason)) return;
    const { control, engines, args } = this.deps;
    const taken = new Set([
      ...engines.ids(),
      ...control.engines().map((e) => e.engine),
      ...this.writtenOff,
    ]);
    let n = 0;
    while (taken.has(`${role}-${n}`)) n++;
    const id = `${role}-${n}`;
    engines.start({ id, role, args });
    this.mine.set(id, role);
    await this.record(id, {
      state: 'started',
      role,
      by: 'planner',
      reason,
      ...(replaces !== undefined ? { replaces } : {}),
    });
    // An engine written off meanwhile (it crash-looped) ends the wait too.
    await this.until(
      () => control.engine(id) !== undefined || this.writtenOff.has(id),
      this.deps.startTimeoutMs ?? 30_000,
    );
  }

  /**
   * Retires the engine of `role` that this stack supervises whose drain should end soonest
   * (`soonestDrained`): drained, then stopped and forgotten. Its id, or null when there is none
   * to retire.
   */
  private async retire(role: Role, reason: string): Promise<string | null> {
    if (this.stopping) return null;
    const { control, engines, log } = this.deps;
    const supervised = new Set(engines.ids());
    const engine = soonestDrained(
      control.engines().filter((e) => e.role === role && supervised.has(e.engine)),
      control.liveRooms(),
    );
    if (engine === undefined) {
      log.warn({ role, reason }, `the planner found no ${role} engine of its own to retire`);
      return null;
    }
    await this.record(engine, { state: 'draining', role, by: 'planner', reason });
    // No new rooms from now on; those whose prefill has not begun move to other pairs, and it
    // finishes the rest. (Not the engine's own drain: it would refuse a room admitted just before,
    // whose room.created reaches it after the command.)
    const moved = await control.retire(engine);
    if (moved > 0) log.info({ engine, moved }, 'moved rooms not yet begun off a retiring engine');
    const rooms = () => control.engine(engine)?.liveRooms ?? 0;
    await this.until(() => rooms() === 0, this.deps.drainDeadlineMs ?? 30_000);
    const left = rooms();
    await this.record(engine, { state: 'drained', role, by: 'planner', reason, rooms: left });
    // Rooms left at the deadline move as soon as it is gone: no need to wait out its own drain.
    await engines.retire(engine, left > 0 ? 0 : 10_000);
    control.forgetEngine(engine);
    this.mine.delete(engine);
    await this.record(engine, { state: 'stopped', role, by: 'planner', reason });
    return engine;
  }

  /**
   * The supervisor gave up on `id` for crash-looping (supervisor.ts `onGiveUp`). One this planner
   * started is written off: journaled `stopped`, forgotten by the control plane (the planner's
   * count of the fleet no longer holds it), and its role held (`holdAfterCrashLoopMs`). Engines
   * it did not start are left as they are: the operator's (an operator is needed).
   */
  async gaveUp(id: string, why: string): Promise<void> {
    const role = this.mine.get(id);
    if (role === undefined) return;
    this.mine.delete(id);
    this.writtenOff.add(id);
    const holdMs = this.deps.holdAfterCrashLoopMs ?? SUPERVISOR_DEFAULTS.crashWindowMs;
    this.held.set(role, { until: Date.now() + holdMs, engine: id, logged: false });
    this.deps.control.forgetEngine(id);
    this.deps.log.error(
      { engine: id, role, holdMs },
      `${id}, started by the planner, crash-looped (${why}); written off, and no ${role} engine is started for ${Math.round(holdMs / 1000)} s — its log says why; fix the engine flags (--engine-args) or the host`,
    );
    await this.record(id, { state: 'stopped', role, by: 'planner', reason: why });
  }

  /** Whether starts of `role` are held after a crash loop; logs the first step it holds. */
  private holding(role: Role, reason: string): boolean {
    const h = this.held.get(role);
    if (h === undefined || Date.now() >= h.until) return false;
    if (!h.logged)
      this.deps.log.warn(
        { role, step: reason, engine: h.engine, until: new Date(h.until).toISOString() },
        `the planner starts no ${role} engine until ${new Date(h.until).toISOString()}: ${h.engine}, the last it started, crash-looped`,
      );
    h.logged = true;
    return true;
  }

  private record(engine: string, data: Lifecycle): Promise<unknown> {
    return this.deps.journal
      .append({ type: 'engine.lifecycle', engine, source: 'planner', data })
      .catch((err) =>
        this.deps.log.error(
          { err, engine, state: data.state },
          'could not journal engine.lifecycle',
        ),
      );
  }

  /** Resolves once `done()` holds, `ms` have passed, or the stack is stopping. */
  private async until(done: () => boolean, ms: number): Promise<void> {
    const deadline = Date.now() + ms;
    while (!done() && !this.stopping && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

/**
 * Of the engines that may be retired, the one whose drain should end soonest: the fewest prompt
 * tokens in prefill on its rooms — a room whose prefill has begun stays on it to the end, and a
 * long prompt's prefill takes seconds (its rooms not begun move at once: `ControlPlane.retire`) —
 * then the fewest rooms.
 */
export function soonestDrained(
  engines: ReadonlyArray<Pick<EngineView, 'engine' | 'liveRooms'>>,
  rooms: Iterable<Room>,
): string | undefined {
  const inPrefill = new Map<string, number>();
  for (const r of rooms) {
    if (r.state !== 'prefilling') continue;
    for (const e of [r.prefillEngine, r.decodeEngine])
      inPrefill.set(e, (inPrefill.get(e) ?? 0) + (r.promptTokens ?? 0));
  }
  const cost = (e: string) => inPrefill.get(e) ?? 0;
  return [...engines].sort(
    (a, b) => cost(a.engine) - cost(b.engine) || a.liveRooms - b.liveRooms,
  )[0]?.engine;
}
