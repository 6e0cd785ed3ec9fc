/**
 * The escalation ladder's decisions (ladder.ts has the rungs and why), apart from what doing them
 * takes (issue 41): `decideLadder` is a pure function of where each engine stands and what the
 * control plane sees at one tick, returning where each stands next and the commands to run —
 * journal an event, try a rung, say something in the log. `EscalationLadder` gathers the tick's
 * input and runs the commands (signals, restarts, fences and cordons, appends). Its tests are
 * given/when/then on data (ladder-decide.unit.test.ts): no control plane, no supervisor, no clock.
 */
import {
  type EngineView,
  heartbeatStall,
  type LivenessPolicy,
} from '../control/engines/engine-view.ts';
import {
  DEFAULT_STALL_POLICY,
  type Stall,
  type StallKind,
  type StallPolicy,
} from '../control/evidence/stalls.ts';
import type { EventInput } from '../room/events.ts';

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

export interface Incident {
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

/** Where one engine stands on the ladder. */
export interface EngineLadder {
  phase: LadderPhase;
  incident: Incident | null;
  resets: number;
  restarts: number;
  restartTimes: number[];
  lastOutcome: string | null;
  /** The last incident that ended in recovery: its kind, the rung that worked, and when. */
  lastRecovery: { kind: StallKind; rung: LadderRung; at: number } | null;
}

export type LadderState = ReadonlyMap<string, Readonly<EngineLadder>>;

/** What the ladder sees at one tick. */
export interface LadderTick {
  now: number;
  /** The engines as the control plane shows them now. */
  engines: readonly EngineView[];
  /** This tick's stall findings (stalls.ts). */
  stalls: readonly Stall[];
  /** Since when this process has been running without a pause: heartbeats count from then. */
  listeningSince: number;
  liveness: Readonly<LivenessPolicy>;
  /** Engines whose process this control plane's supervisor runs: it can signal and restart them. */
  supervised: ReadonlySet<string>;
  /** Every engine the supervisor runs: what `restart_stack` restarts. */
  stack: readonly string[];
  /**
   * Whether the journal takes writes. Every rung above the in-place reset moves rooms or
   * restarts processes, and is made only once its record is committed (an operator must find in
   * the journal why a healthy engine was restarted): while it refuses writes, the ladder resets in
   * place and holds there.
   */
  journalWritable: boolean;
}

export type LadderCommand =
  | { kind: 'journal'; event: EventInput }
  /**
   * Try `rung` on the engine's `incarnation` and journal it (`recovery.action` with what it came
   * to); `restart`: the engines a restart rung restarts.
   */
  | {
      kind: 'rung';
      engine: string;
      incarnation: string;
      rung: LadderRung;
      reason: string;
      detectMs: number;
      evidence: string | null;
      stalled: string[] | null;
      restart: readonly string[];
    }
  | { kind: 'log'; level: 'warn' | 'error'; msg: string; fields: Record<string, unknown> };

export interface LadderDecision {
  state: LadderState;
  commands: LadderCommand[];
  /** The rungs tried, as `engine:rung`. */
  acted: string[];
}

function fresh(): EngineLadder {
  return {
    phase: 'ok',
    incident: null,
    resets: 0,
    restarts: 0,
    restartTimes: [],
    lastOutcome: null,
    lastRecovery: null,
  };
}

function copy(l: Readonly<EngineLadder>): EngineLadder {
  return { ...l, incident: l.incident && { ...l.incident }, restartTimes: [...l.restartTimes] };
}

/** One pass over the engines. The state given is not changed: the next one is returned. */
export function decideLadder(
  s: LadderState,
  t: LadderTick,
  policy: Readonly<LadderPolicy>,
): LadderDecision {
  const { now } = t;
  const engines = new Map([...s].map(([id, l]) => [id, copy(l)]));
  const commands: LadderCommand[] = [];
  const acted: string[] = [];
  const journal = (event: EventInput): void => {
    commands.push({ kind: 'journal', event });
  };
  const log = (level: 'warn' | 'error', msg: string, fields: Record<string, unknown>): void => {
    commands.push({ kind: 'log', level, msg, fields });
  };

  /** Why the engine counts as stalled now, and since when, or null. */
  const stalledNow = (v: EngineView): Omit<Stall, 'engine'> | null =>
    t.stalls.find((x) => x.engine === v.engine) ??
    // Heartbeats are judged only from when this process was last seen listening: one that was
    // stopped or blocked heard nothing, and no engine is to blame for it.
    heartbeatStall(
      { connected: v.status !== 'connecting', lastSeen: v.lastSeen },
      t.liveness,
      now,
      t.listeningSince,
    );

  /** Serving again since the rung was tried: a newer hello, heartbeats on it, caught up. */
  const recovered = (v: EngineView, i: Incident): boolean => {
    if (v.status === 'connecting' || v.beats < 2 || stalledNow(v)) return false;
    return i.rung === 'reset_in_place' ? v.session !== i.session : v.incarnation !== i.incarnation;
  };

  const tryRung = (v: EngineView, l: EngineLadder, rung: LadderRung): void => {
    const i = l.incident as Incident;
    i.rung = rung;
    i.actedAt = now;
    i.session = v.session;
    i.incarnation = v.incarnation;
    let restart: readonly string[] = [];
    if (rung === 'reset_in_place') {
      l.phase = 'resetting';
      l.resets++;
    } else if (rung === 'cordon_engine') l.phase = 'cordoned';
    else if (rung === 'fence_engine') l.phase = 'fenced';
    else {
      l.phase = rung === 'restart_engine' ? 'restarting' : 'restarting_stack';
      l.restarts++;
      l.restartTimes.push(now);
      restart = rung === 'restart_engine' ? [v.engine] : t.stack;
      log('error', 'escalating: restarting', { engine: v.engine, rung, engines: restart });
    }
    commands.push({
      kind: 'rung',
      engine: v.engine,
      incarnation: v.incarnation,
      rung,
      reason: i.reason,
      detectMs: i.detectedAt - i.beganAt,
      evidence: i.evidence,
      stalled: i.stalled,
      restart,
    });
  };

  const journalRung = (engine: string, i: Incident, outcome: string): void =>
    journal({
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

  const giveUp = (engine: string, l: EngineLadder, why: string): void => {
    l.phase = 'gave_up';
    l.lastOutcome = `gave up: ${why}`;
    log('error', 'escalation ladder gave up on this engine; an operator is needed', {
      engine,
      why,
    });
    journal({
      type: 'recovery.action',
      engine,
      source: 'watchdog',
      data: { action: 'give_up', reason: l.incident?.reason ?? why, outcome: why },
    });
  };

  /**
   * Whether the evidence implicates what the engines share: `sharedStalls` engines (this one
   * included) stalled within `sharedWindowMs` — an incident opened, or one closed, in that window.
   */
  const sharedEvidence = (engine: string) => {
    const { sharedStalls, sharedWindowMs } = policy;
    const recent = [...engines.entries()]
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
  };

  /** Tries the rung above `from`; gives up when there is none, or no restart may be made. */
  const escalate = (v: EngineView, l: EngineLadder, from: LadderRung): LadderRung | null => {
    const i = l.incident as Incident;
    let next: LadderRung | null = from === 'reset_in_place' ? 'restart_engine' : null;
    if (from === 'restart_engine') {
      const shared = sharedEvidence(v.engine);
      i.evidence = shared.evidence;
      i.stalled = shared.stalled;
      next = shared.shared ? 'restart_stack' : 'cordon_engine';
    }
    if (from === 'fence_engine') {
      giveUp(
        v.engine,
        l,
        `fenced, and not back as a new incarnation within ${Math.round(policy.restartGraceMs / 1000)} s: check its host and its supervisor`,
      );
      return null;
    }
    if (next === null) {
      giveUp(v.engine, l, 'every rung was tried');
      return null;
    }
    if (next === 'cordon_engine') {
      tryRung(v, l, next);
      return next;
    }
    const recent = l.restartTimes.filter((at) => now - at < policy.restartWindowMs);
    if (recent.length >= policy.maxRestarts) {
      giveUp(
        v.engine,
        l,
        `restart cap reached (${recent.length} in ${Math.round(policy.restartWindowMs / 1000)} s)`,
      );
      return null;
    }
    if (!t.supervised.has(v.engine)) {
      // Not ours to restart: fenced instead — its rooms move, and its own supervisor restarts it
      // when it is told (BUS_FENCED), or an operator does.
      tryRung(v, l, 'fence_engine');
      return 'fence_engine';
    }
    tryRung(v, l, next);
    return next;
  };

  /** An engine found stalled while `ok`: the incident opens, and its first rung is tried. */
  const open = (v: EngineView, l: EngineLadder, st: Omit<Stall, 'engine'>): void => {
    // A silent engine not ours is fenced at once, and a relapse skips the rungs that did not
    // last: both need the journal. While it refuses writes, a relapsing engine is reset in place,
    // and one nothing reaches waits for the journal.
    const silentElsewhere = st.kind === 'heartbeat' && !t.supervised.has(v.engine);
    if (silentElsewhere && !t.journalWritable) return;
    // The same stall again soon after a recovery: the rung that worked did not last.
    const last = l.lastRecovery;
    const relapse =
      last !== null && last.kind === st.kind && now - last.at < policy.relapseMs ? last : null;
    l.incident = {
      kind: st.kind,
      reason: relapse
        ? `${st.reason} (again ${Math.round((now - relapse.at) / 1000)} s after ${relapse.rung} brought it back)`
        : st.reason,
      beganAt: st.since,
      detectedAt: now,
      rung: 'reset_in_place',
      actedAt: now,
      session: v.session,
      incarnation: v.incarnation,
      evidence: null,
      stalled: null,
    };
    journal({
      type: 'engine.stalled',
      engine: v.engine,
      source: 'watchdog',
      data: { reason: l.incident.reason },
    });
    if (relapse && t.journalWritable) {
      const rung = escalate(v, l, relapse.rung);
      if (rung) acted.push(`${v.engine}:${rung}`);
      return;
    }
    if (silentElsewhere) {
      // Silent, and not ours to signal: nothing reaches it, so its rooms move now.
      log('error', 'engine silent and not started here; fencing it', {
        engine: v.engine,
        reason: st.reason,
      });
      tryRung(v, l, 'fence_engine');
      acted.push(`${v.engine}:fence_engine`);
      return;
    }
    log('error', 'engine stalled; resetting it in place', { engine: v.engine, reason: st.reason });
    tryRung(v, l, 'reset_in_place');
    acted.push(`${v.engine}:reset_in_place`);
  };

  const close = (engine: string, l: EngineLadder, i: Incident): void => {
    const ms = now - i.beganAt;
    l.lastOutcome = `${i.rung} recovered ${ms} ms after the stall began`;
    log('warn', 'engine serving again', { engine, rung: i.rung, recoverMs: ms });
    journalRung(engine, i, 'recovered');
    journal({
      type: 'engine.recovered',
      engine,
      source: 'watchdog',
      data: { reason: `${i.rung} after: ${i.reason}`, rung: i.rung, recoverMs: ms },
    });
    l.phase = 'ok';
    l.incident = null;
    l.lastRecovery = { kind: i.kind, rung: i.rung, at: now };
  };

  for (const v of t.engines) {
    let l = engines.get(v.engine);
    if (!l) {
      l = fresh();
      engines.set(v.engine, l);
    }
    const i = l.incident;
    if (l.phase === 'ok') {
      const st = stalledNow(v);
      if (st) open(v, l, st);
      continue;
    }
    if (!i) continue;
    if (recovered(v, i)) {
      close(v.engine, l, i);
      continue;
    }
    if (l.phase === 'gave_up' || l.phase === 'cordoned') continue;
    const grace = i.rung === 'reset_in_place' ? policy.resetGraceMs : policy.restartGraceMs;
    if (now - i.actedAt < grace || !t.journalWritable) continue;
    journalRung(v.engine, i, `failed: not serving ${grace} ms after ${i.rung}`);
    const rung = escalate(v, l, i.rung);
    if (rung) acted.push(`${v.engine}:${rung}`);
  }
  return { state: engines, commands, acted };
}
