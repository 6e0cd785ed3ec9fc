/**
 * The escalation ladder for a stalled engine (docs/design.md §9). The first rung — failing rooms that
 * overstay their state — is the watchdog's (watchdog.ts); this takes an engine declared stalled up
 * the rest, one rung at a time, until it serves again:
 *
 *   2. `reset_in_place`: the engine replaces its bus connection and receive loop and cancels stuck
 *      transfers; the process and its model stay up (SIGHUP from the supervisor, which reaches an
 *      engine whose receive loop is dead; a `reset_in_place` command for engines not ours).
 *   3. `restart_engine`: that one process is killed and respawned; it rejoins as a new incarnation.
 *   4. `cordon_engine` when the evidence names that engine alone: it takes no new rooms until an
 *      operator uncordons it, its rooms move to healthy pairs and its incarnation is fenced (the
 *      supervisor starts it again, cordoned, for inspection) — one faulty engine never costs the
 *      fleet a restart. `restart_stack` — every engine process restarted — only when the evidence
 *      implicates what the engines share: `sharedStalls` engines stalled within `sharedWindowMs`.
 *
 * An engine this control plane did not start cannot be restarted from here: where the ladder
 * would restart it, it is fenced instead (`fence_engine`) — its rooms move to healthy pairs and
 * its incarnation is refused from then on, so that when it is heard from again it exits and its
 * own supervisor starts it afresh. One that falls silent (no heartbeat: its host was cut off, or
 * the process hangs) is fenced at once, since no reset can reach it.
 *
 * Each rung is journaled as `recovery.action` (requested, then recovered or failed, with detectMs
 * and recoverMs), the incident opens with `engine.stalled` and closes with `engine.recovered`.
 * What counts as stalled is stalls.ts's (plus stale heartbeats, here). An engine that stalls the
 * same way again soon after recovering starts above the rung that brought it back (back-off), and
 * restarts are capped per engine in a window; past the last rung or the cap the ladder stops at
 * `gave_up` (an operator is needed; /health/ready stays red) until the engine is healthy again.
 */
import type { ControlPlane } from '../control/control-plane.ts';
import { type EngineView, heartbeatStall } from '../control/engine-view.ts';
import {
  DEFAULT_STALL_POLICY,
  type Stall,
  type StallKind,
  type StallPolicy,
} from '../control/stalls.ts';
import type { EventInput } from '../journal/events.ts';
import type { JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { type Clock, systemClock, type Timer } from '../ports/clock.ts';
import type { Supervisor } from './supervisor.ts';

/** When an engine is stalled (stalls.ts), and how the ladder answers. */
export interface LadderPolicy extends StallPolicy {
  /** How long the in-place reset has to bring the engine back. Default 2000 ms. */
  resetGraceMs: number;
  /** How long a restarted engine (or stack) has to come back. Default 15 s. */
  restartGraceMs: number;
  /** Most restarts (engine or stack) per engine within `restartWindowMs`. Default 3 in 10 min. */
  maxRestarts: number;
  restartWindowMs: number;
  /**
   * An engine that stalls again the same way within this long of recovering starts one rung
   * above the one that last brought it back, so an engine that keeps wedging is not reset in
   * place forever. Default 30 s.
   */
  relapseMs: number;
  /**
   * The top rung restarts every engine only when this many engines (this one included) stalled
   * within `sharedWindowMs`: then the fault is likelier in what they share (the bus, this host,
   * the control plane) than in one of them. Otherwise the engine is cordoned. Default 2 in 60 s.
   */
  sharedStalls: number;
  sharedWindowMs: number;
}

export const DEFAULT_LADDER_POLICY: Readonly<LadderPolicy> = Object.freeze({
  ...DEFAULT_STALL_POLICY,
  resetGraceMs: 2000,
  restartGraceMs: 15_000,
  maxRestarts: 3,
  restartWindowMs: 600_000,
  relapseMs: 30_000,
  sharedStalls: 2,
  sharedWindowMs: 60_000,
});

export type LadderPhase =
  | 'ok'
  | 'resetting'
  | 'restarting'
  | 'restarting_stack'
  | 'fenced'
  | 'cordoned'
  | 'gave_up';
export type LadderRung =
  | 'reset_in_place'
  | 'restart_engine'
  | 'cordon_engine'
  | 'restart_stack'
  | 'fence_engine';

/** Where one engine stands on the ladder (`/v1/engines`, `pdctl engines`). */
export interface LadderView {
  phase: LadderPhase;
  /** Why the current incident began; null when `ok`. */
  reason: string | null;
  /** When it was detected (unix ms); null when `ok`. */
  detectedAt: number | null;
  resets: number;
  restarts: number;
  /** The last rung's outcome, e.g. `reset_in_place recovered in 312 ms`. */
  lastOutcome: string | null;
}

interface Incident {
  kind: StallKind;
  reason: string;
  /** When the problem began (the engine fell behind, or its last heartbeat) and was noticed. */
  beganAt: number;
  detectedAt: number;
  rung: LadderRung;
  actedAt: number;
  /** The engine's session and incarnation when the rung was tried: recovery means a newer one. */
  session: number;
  incarnation: string;
  /** Why the top rung chose what it did (`cordon_engine` or `restart_stack`). */
  evidence: string | null;
  /** The engines that stalled within the window, this one included: the evidence's names. */
  stalled: string[] | null;
}

interface EngineLadder {
  phase: LadderPhase;
  incident: Incident | null;
  resets: number;
  restarts: number;
  restartTimes: number[];
  lastOutcome: string | null;
  /** The last incident that ended in recovery: its kind, the rung that worked, and when. */
  lastRecovery: { kind: StallKind; rung: LadderRung; at: number } | null;
}

/**
 * A gap between two ladder ticks this long says the process was not running (see `tick`). Shorter
 * than the shortest window of evidence a detector needs (a bus loop 500 ms behind, stalls.ts):
 * a pause long enough to make any detector fire is one the ladder notices itself. (At 1 s, the
 * simulator found a control plane stopped for 0.8 s resetting two healthy engines on SIGCONT.)
 */
const NOT_LISTENING_MS = 400;

export class EscalationLadder {
  /** When this process was last found to have not been running; heartbeats count from then. */
  private listeningSince = 0;
  private lastTickAt = 0;
  private readonly engines = new Map<string, EngineLadder>();
  private timer: Timer | null = null;
  private readonly policy: LadderPolicy;

  constructor(
    /** What the ladder reads of the control plane, and the in-place reset it asks of it. */
    private readonly control: Pick<
      ControlPlane,
      'engines' | 'stalledEngines' | 'command' | 'fence' | 'liveness' | 'registry' | 'book'
    >,
    /** Where every rung is recorded (`recovery.action`, `engine.stalled`, …). */
    private readonly journal: Pick<JournalStore, 'append'>,
    private readonly supervisor: Supervisor,
    private readonly log: Logger,
    policy: Partial<LadderPolicy> = {},
    private readonly clock: Clock = systemClock,
  ) {
    this.policy = { ...DEFAULT_LADDER_POLICY, ...policy };
  }

  /** Every 100 ms: a stall is acted on within a tenth of a second of being seen. */
  start(intervalMs = 100): void {
    if (this.timer) return;
    // A pause before the first tick is one too.
    this.lastTickAt = this.clock.now();
    this.timer = this.clock.setInterval(() => this.tick(), intervalMs).unref();
  }

  stop(): void {
    this.clock.clear(this.timer);
    this.timer = null;
  }

  /** Total engine restarts the ladder made (rung 3 and 4). */
  get restarts(): number {
    let n = 0;
    for (const l of this.engines.values()) n += l.restarts;
    return n;
  }

  view(engine: string): LadderView {
    const l = this.engines.get(engine);
    return {
      phase: l?.phase ?? 'ok',
      reason: l?.incident?.reason ?? null,
      detectedAt: l?.incident?.detectedAt ?? null,
      resets: l?.resets ?? 0,
      restarts: l?.restarts ?? 0,
      lastOutcome: l?.lastOutcome ?? null,
    };
  }

  private ladder(engine: string): EngineLadder {
    let l = this.engines.get(engine);
    if (!l) {
      l = {
        phase: 'ok',
        incident: null,
        resets: 0,
        restarts: 0,
        restartTimes: [],
        lastOutcome: null,
        lastRecovery: null,
      };
      this.engines.set(engine, l);
    }
    return l;
  }

  /** Why the engine counts as stalled now, and since when (`stalls`: this tick's findings), or null. */
  private stalled(
    s: EngineView,
    now: number,
    stalls: readonly Stall[],
  ): Omit<Stall, 'engine'> | null {
    const found = stalls.find((x) => x.engine === s.engine);
    if (found) return found;
    // Heartbeats are judged only from when this process was last seen listening: one that was
    // stopped or blocked (SIGSTOP, a long pause) heard nothing, and no engine is to blame for it.
    // How old is too old is the control plane's one liveness policy (engine-view.ts).
    return heartbeatStall(
      { connected: s.status !== 'connecting', lastSeen: s.lastSeen },
      this.control.liveness,
      now,
      this.listeningSince,
    );
  }

  /** Serving again since the rung was tried: a newer hello, heartbeats on it, caught up. */
  private recovered(
    s: EngineView | undefined,
    i: Incident,
    now: number,
    stalls: readonly Stall[],
  ): boolean {
    if (!s || s.status === 'connecting' || s.beats < 2 || this.stalled(s, now, stalls))
      return false;
    return i.rung === 'reset_in_place' ? s.session !== i.session : s.incarnation !== i.incarnation;
  }

  /** One pass over the engines; returns the rungs it tried, as `engine:rung`. */
  tick(now = this.clock.now()): string[] {
    // Ticks come every 100 ms; a gap of 400 ms (on the real clock) means this process did not
    // run — it was stopped, or its event loop blocked — and heard nothing meanwhile: heartbeats
    // and every stall detector's evidence count from now.
    const real = this.clock.now();
    if (this.lastTickAt !== 0 && real - this.lastTickAt > NOT_LISTENING_MS)
      this.listeningSince = now;
    this.lastTickAt = real;
    const acted: string[] = [];
    // One pass over the rooms for every engine, not one per engine.
    const stalls = this.control.stalledEngines(this.policy, now, this.listeningSince);
    for (const s of this.control.engines(now, stalls)) {
      const l = this.ladder(s.engine);
      const i = l.incident;
      if (l.phase === 'ok') {
        const st = this.stalled(s, now, stalls);
        if (!st) continue;
        // The same stall again soon after a recovery: the rung that worked did not last.
        const last = l.lastRecovery;
        const relapse =
          last !== null && last.kind === st.kind && now - last.at < this.policy.relapseMs
            ? last
            : null;
        l.incident = {
          kind: st.kind,
          reason: relapse
            ? `${st.reason} (again ${Math.round((now - relapse.at) / 1000)} s after ${relapse.rung} brought it back)`
            : st.reason,
          beganAt: st.since,
          detectedAt: now,
          rung: 'reset_in_place',
          actedAt: now,
          session: s.session,
          incarnation: s.incarnation,
          evidence: null,
          stalled: null,
        };
        this.note({
          type: 'engine.stalled',
          engine: s.engine,
          source: 'watchdog',
          data: { reason: l.incident.reason },
        });
        if (relapse) {
          const rung = this.escalate(s, l, relapse.rung, now);
          if (rung) acted.push(`${s.engine}:${rung}`);
          continue;
        }
        if (st.kind === 'heartbeat' && this.supervisor.pid(s.engine) === undefined) {
          // Silent, and not ours to signal: nothing reaches it, so its rooms move now.
          this.log.error(
            { engine: s.engine, reason: st.reason },
            'engine silent and not started here; fencing it',
          );
          this.tryRung(s, l, 'fence_engine', now);
          acted.push(`${s.engine}:fence_engine`);
          continue;
        }
        this.log.error(
          { engine: s.engine, reason: st.reason },
          'engine stalled; resetting it in place',
        );
        this.tryRung(s, l, 'reset_in_place', now);
        acted.push(`${s.engine}:reset_in_place`);
        continue;
      }
      if (!i) continue;
      if (this.recovered(s, i, now, stalls)) {
        this.closeIncident(s.engine, l, i, now);
        continue;
      }
      if (l.phase === 'gave_up' || l.phase === 'cordoned') continue;
      const grace =
        i.rung === 'reset_in_place' ? this.policy.resetGraceMs : this.policy.restartGraceMs;
      if (now - i.actedAt < grace) continue;
      this.journalRung(s.engine, i, `failed: not serving ${grace} ms after ${i.rung}`, now);
      const rung = this.escalate(s, l, i.rung, now);
      if (rung) acted.push(`${s.engine}:${rung}`);
    }
    return acted;
  }

  /** Tries the rung above `from`; gives up when there is none, or no restart may be made. */
  private escalate(
    s: EngineView,
    l: EngineLadder,
    from: LadderRung,
    now: number,
  ): LadderRung | null {
    const i = l.incident as Incident;
    let next: LadderRung | null = from === 'reset_in_place' ? 'restart_engine' : null;
    if (from === 'restart_engine') {
      const shared = this.sharedEvidence(s.engine, now);
      i.evidence = shared.evidence;
      i.stalled = shared.stalled;
      next = shared.shared ? 'restart_stack' : 'cordon_engine';
    }
    if (from === 'fence_engine') {
      this.giveUp(
        s.engine,
        l,
        `fenced, and not back as a new incarnation within ${Math.round(this.policy.restartGraceMs / 1000)} s: check its host and its supervisor`,
      );
      return null;
    }
    if (next === null) {
      this.giveUp(s.engine, l, 'every rung was tried');
      return null;
    }
    if (next === 'cordon_engine') {
      this.tryRung(s, l, next, now);
      return next;
    }
    const recent = l.restartTimes.filter((t) => now - t < this.policy.restartWindowMs);
    if (recent.length >= this.policy.maxRestarts) {
      this.giveUp(
        s.engine,
        l,
        `restart cap reached (${recent.length} in ${Math.round(this.policy.restartWindowMs / 1000)} s)`,
      );
      return null;
    }
    if (this.supervisor.pid(s.engine) === undefined) {
      // Not ours to restart: fenced instead — its rooms move, and its own supervisor restarts it
      // when it is told (BUS_FENCED), or an operator does.
      this.tryRung(s, l, 'fence_engine', now);
      return 'fence_engine';
    }
    this.tryRung(s, l, next, now);
    return next;
  }

  /**
   * Whether the evidence implicates what the engines share: `sharedStalls` engines (this one
   * included) stalled within `sharedWindowMs` — an incident opened, or one closed, in that window.
   */
  private sharedEvidence(
    engine: string,
    now: number,
  ): { shared: boolean; evidence: string; stalled: string[] } {
    const { sharedStalls, sharedWindowMs } = this.policy;
    const recent = [...this.engines.entries()]
      .filter(
        ([id, l]) =>
          id === engine ||
          (l.incident !== null && now - l.incident.detectedAt <= sharedWindowMs) ||
          (l.lastRecovery !== null && now - l.lastRecovery.at <= sharedWindowMs),
      )
      .map(([id]) => id);
    const window = `${Math.round(sharedWindowMs / 1000)} s`;
    return recent.length >= sharedStalls
      ? {
          shared: true,
          stalled: recent,
          evidence: `${recent.length} engines stalled within ${window} (${recent.join(', ')}): the fault is likelier in what they share`,
        }
      : {
          shared: false,
          stalled: recent,
          evidence: `${engine} alone stalled within ${window}, and a restart did not cure it: the fault is its own`,
        };
  }

  private tryRung(s: EngineView, l: EngineLadder, rung: LadderRung, now: number): void {
    const i = l.incident as Incident;
    i.rung = rung;
    i.actedAt = now;
    i.session = s.session;
    i.incarnation = s.incarnation;
    let outcome: string;
    if (rung === 'reset_in_place') {
      l.phase = 'resetting';
      l.resets++;
      const signalled = this.supervisor.signal(s.engine, 'SIGHUP');
      const commanded =
        !signalled && this.control.command(s.engine, 'reset_in_place', null, i.reason);
      outcome = signalled
        ? 'requested (SIGHUP)'
        : commanded
          ? 'requested (command)'
          : 'could not reach the engine';
    } else if (rung === 'cordon_engine') {
      l.phase = 'cordoned';
      const { control, journal, log } = this;
      void control.registry.cordons
        .cordon({ journal, log, control }, s.engine, s.incarnation, i.reason, 'ladder', i.evidence)
        .catch((err) => log.error({ err, engine: s.engine }, 'could not journal the cordon'));
      outcome = `cordoned: no new rooms, its rooms move to healthy pairs, its incarnation fenced; \`pdctl engines uncordon ${s.engine}\` takes it back`;
    } else if (rung === 'fence_engine') {
      l.phase = 'fenced';
      outcome = this.control.fence(s.engine, s.incarnation, i.reason)
        ? 'fenced: its rooms move to healthy pairs; it must rejoin as a new incarnation'
        : 'it had already been replaced';
    } else {
      l.phase = rung === 'restart_engine' ? 'restarting' : 'restarting_stack';
      l.restarts++;
      l.restartTimes.push(now);
      const ids = rung === 'restart_engine' ? [s.engine] : this.supervisor.ids();
      for (const id of ids) {
        void this.supervisor
          .restartNow(id)
          .catch((err) => this.log.error({ err, engine: id }, 'restart failed'));
      }
      outcome = `requested (${ids.join(', ')})`;
      this.log.error({ engine: s.engine, rung, engines: ids }, 'escalating: restarting');
    }
    this.note({
      type: 'recovery.action',
      engine: s.engine,
      source: 'watchdog',
      data: {
        action: rung,
        reason: i.reason,
        outcome,
        detectMs: i.detectedAt - i.beganAt,
        ...(i.evidence ? { evidence: i.evidence } : {}),
        ...(i.stalled ? { stalled: i.stalled } : {}),
      },
    });
  }

  private journalRung(engine: string, i: Incident, outcome: string, now: number): void {
    this.note({
      type: 'recovery.action',
      engine,
      source: 'watchdog',
      data: {
        action: i.rung,
        reason: i.reason,
        outcome,
        detectMs: i.detectedAt - i.beganAt,
        recoverMs: now - i.beganAt,
      },
    });
  }

  private closeIncident(engine: string, l: EngineLadder, i: Incident, now: number): void {
    const ms = now - i.beganAt;
    l.lastOutcome = `${i.rung} recovered ${ms} ms after the stall began`;
    this.log.warn({ engine, rung: i.rung, recoverMs: ms }, 'engine serving again');
    this.journalRung(engine, i, 'recovered', now);
    this.note({
      type: 'engine.recovered',
      engine,
      source: 'watchdog',
      data: { reason: `${i.rung} after: ${i.reason}`, rung: i.rung, recoverMs: ms },
    });
    l.phase = 'ok';
    l.incident = null;
    l.lastRecovery = { kind: i.kind, rung: i.rung, at: now };
  }

  private giveUp(engine: string, l: EngineLadder, why: string): void {
    l.phase = 'gave_up';
    l.lastOutcome = `gave up: ${why}`;
    this.log.error(
      { engine, why },
      'escalation ladder gave up on this engine; an operator is needed',
    );
    this.note({
      type: 'recovery.action',
      engine,
      source: 'watchdog',
      data: { action: 'give_up', reason: l.incident?.reason ?? why, outcome: why },
    });
  }

  private note(event: EventInput): void {
    this.journal
      .append(event)
      .catch((err) =>
        this.log.error({ err, event: event.type }, 'could not journal a recovery step'),
      );
  }
}
