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
 * A rung above the in-place reset moves rooms or restarts processes, so it is made only once its
 * record is committed; while the journal refuses writes the ladder holds at the reset.
 * What counts as stalled is stalls.ts's (plus stale heartbeats, here). An engine that stalls the
 * same way again soon after recovering starts above the rung that brought it back (back-off), and
 * restarts are capped per engine in a window; past the last rung or the cap the ladder stops at
 * `gave_up` (an operator is needed; /health/ready stays red) until the engine is healthy again.
 *
 * What to do at each tick is decided in ladder-decide.ts (pure); this class gathers the tick's
 * input and does it.
 */
import type { ControlPlane } from '../control/control-plane.ts';
import type { JournalLog } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { type Clock, systemClock, type Timer } from '../ports/clock.ts';
import type { EventInput } from '../room/events.ts';
import {
  DEFAULT_LADDER_POLICY,
  decideLadder,
  type LadderCommand,
  type LadderPhase,
  type LadderPolicy,
  type LadderState,
} from './ladder-decide.ts';
import type { Supervisor } from './supervisor.ts';

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
  private state: LadderState = new Map();
  private timer: Timer | null = null;
  private readonly policy: LadderPolicy;

  constructor(
    /** What the ladder reads of the control plane, and the in-place reset it asks of it. */
    private readonly control: Pick<
      ControlPlane,
      'engines' | 'stalledEngines' | 'command' | 'fence' | 'liveness' | 'registry' | 'book'
    >,
    /** Where every rung is recorded (`recovery.action`, `engine.stalled`, …). */
    private readonly journal: Pick<JournalLog, 'append' | 'health'>,
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
    for (const l of this.state.values()) n += l.restarts;
    return n;
  }

  view(engine: string): LadderView {
    const l = this.state.get(engine);
    return {
      phase: l?.phase ?? 'ok',
      reason: l?.incident?.reason ?? null,
      detectedAt: l?.incident?.detectedAt ?? null,
      resets: l?.resets ?? 0,
      restarts: l?.restarts ?? 0,
      lastOutcome: l?.lastOutcome ?? null,
    };
  }

  /**
   * When the ladder last found the engine stalled: its open incident's detection, or its last
   * recovery; null if never. Outlier ejection reads it: a room that failed with an engine the
   * ladder was acting on says nothing against the other engine of its pair.
   */
  troubledAt(engine: string): number | null {
    const l = this.state.get(engine);
    return l?.incident?.detectedAt ?? l?.lastRecovery?.at ?? null;
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
    // One pass over the rooms for every engine, not one per engine.
    const stalls = this.control.stalledEngines(this.policy, now, this.listeningSince);
    const engines = this.control.engines(now, stalls);
    const decided = decideLadder(
      this.state,
      {
        now,
        engines,
        stalls,
        listeningSince: this.listeningSince,
        liveness: this.control.liveness,
        supervised: new Set(
          engines.filter((v) => this.supervisor.pid(v.engine) !== undefined).map((v) => v.engine),
        ),
        stack: this.supervisor.ids(),
        journalWritable: this.journal.health().writable,
      },
      this.policy,
    );
    const before = this.state;
    this.state = decided.state;
    for (const c of decided.commands) this.run(c, before);
    return decided.acted;
  }

  private run(c: LadderCommand, before: LadderState): void {
    if (c.kind === 'journal') this.note(c.event);
    else if (c.kind === 'log') this.log[c.level](c.fields, c.msg);
    else if (c.rung === 'reset_in_place') this.note(this.record(c, this.reset(c.engine, c.reason)));
    else {
      // Every rung above moves rooms or restarts processes: it is made once its record is
      // committed, so that the journal says why an engine was restarted, fenced or cordoned.
      // Refused, the rung was not tried: the engine stands where it stood before this tick.
      this.journal.append(this.record(c, promised(c))).then(
        () => this.act(c),
        (err: unknown) => {
          this.log.error(
            { err, engine: c.engine, rung: c.rung },
            'rung not tried: the journal refused its record; the ladder tries again when it takes writes',
          );
          const next = new Map(this.state);
          const prior = before.get(c.engine);
          if (prior) next.set(c.engine, prior);
          else next.delete(c.engine);
          this.state = next;
        },
      );
    }
  }

  private record(c: Extract<LadderCommand, { kind: 'rung' }>, outcome: string): EventInput {
    return {
      type: 'recovery.action',
      engine: c.engine,
      source: 'watchdog',
      data: {
        action: c.rung,
        reason: c.reason,
        outcome,
        detectMs: c.detectMs,
        ...(c.evidence ? { evidence: c.evidence } : {}),
        ...(c.stalled ? { stalled: c.stalled } : {}),
      },
    };
  }

  /** The in-place reset; returns what it came to. */
  private reset(engine: string, reason: string): string {
    if (this.supervisor.signal(engine, 'SIGHUP')) return 'requested (SIGHUP)';
    return this.control.command(engine, 'reset_in_place', null, reason)
      ? 'requested (command)'
      : 'could not reach the engine';
  }

  /** Does a rung above the in-place reset, its record committed. */
  private act(c: Extract<LadderCommand, { kind: 'rung' }>): void {
    const { control, journal, log, supervisor } = this;
    if (c.rung === 'cordon_engine') {
      void control.registry.cordons
        .cordon({ journal, log, control }, c.engine, c.incarnation, c.reason, 'ladder', c.evidence)
        .catch((err) => log.error({ err, engine: c.engine }, 'could not journal the cordon'));
    } else if (c.rung === 'fence_engine') {
      if (!control.fence(c.engine, c.incarnation, c.reason))
        log.warn({ engine: c.engine }, 'not fenced: it had already been replaced');
    } else
      for (const id of c.restart)
        void supervisor
          .restartNow(id)
          .catch((err) => log.error({ err, engine: id }, 'restart failed'));
  }

  private note(event: EventInput): void {
    this.journal
      .append(event)
      .catch((err) =>
        this.log.error({ err, event: event.type }, 'could not journal a recovery step'),
      );
  }
}

/** What a rung above the in-place reset will do, as its record says before it is done. */
function promised(c: Extract<LadderCommand, { kind: 'rung' }>): string {
  if (c.rung === 'cordon_engine')
    return `cordoned: no new rooms, its rooms move to healthy pairs, its incarnation fenced; \`pdctl engines uncordon ${c.engine}\` takes it back`;
  if (c.rung === 'fence_engine')
    return 'fenced: its rooms move to healthy pairs; it must rejoin as a new incarnation';
  return `requested (${c.restart.join(', ')})`;
}
