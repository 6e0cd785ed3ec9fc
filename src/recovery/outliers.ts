/**
 * Outlier ejection (after Envoy's): an engine whose rooms keep failing by its own fault is taken
 * out of rotation before the ladder would see anything wrong — it may heartbeat and consume
 * perfectly while every KV transfer it makes arrives corrupted. It reads committed room outcomes
 * (the reasons list says whose fault each failure is: journal/reasons.ts `FAILURE_BLAME`):
 *
 *   - `consecutiveFailures` rooms in a row failed, blamed on the engine itself (`prefill`,
 *     `decode`, or the engine that reported it); or
 *   - `consecutiveFailures` rooms in a row failed by its fault or its pair's, or of its last
 *     `windowRooms` rooms (at least `minRooms`) a share of at least `failureRate` did; and its
 *     role's peers failed at most half as often over theirs. (The streak matters where routing
 *     sends an engine few rooms once one fails: the bad-engine drill's corrupting prefill engine
 *     got two rooms every 5 s, and its window, full of rooms served before the fault, took 26 s
 *     to pass half.) A fault of the pair counts against an engine only where the other engine
 *     of the pair was seen serving its other rooms well meanwhile (`pairEvidenceRooms` of them,
 *     failing at most half of `failureRate`, of its rooms kept for `historyMs`): where that
 *     one failed with others too, served none, or no longer keeps all of those, the
 *     evidence does not say which of the two it was, and it is left out of both counts. (Counted
 *     against both, a healthy decode engine whose rooms happened to meet two corrupting prefill
 *     engines more often than its peer's did was ejected: the simulator, --faults all seed 44.)
 *
 * An ejected engine gets no room (the registry's `ejections`) until a canary through it passes —
 * tried `ejectedMs` after the ejection, which doubles with each ejection (from `baseEjectionMs`,
 * at most `maxEjectionMs`); a canary that fails ejects it again, longer. Never more than
 * `maxEjectedShare` of a role's engines are out (cordoned or ejected) at once, at least one kept,
 * so a fault in what they share cannot empty a role. Each ejection and return is journaled
 * (`engine.ejected`, `engine.returned`) and shown in `/metrics`, `/ui` and `pdctl engines`.
 */

import type { ControlPlane } from '../control/control-plane.ts';
import type { RefusedClaim } from '../control/engines/appends.ts';
import type { JournalLog } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import { type Clock, systemClock, type Timer } from '../ports/clock.ts';
import type { JournalEvent } from '../room/events.ts';
import { FAILURE_BLAME, isFailureReason } from '../room/reasons.ts';
import type { Room } from '../room/reducer.ts';
import { isTerminal } from '../room/states.ts';
import type { EscalationLadder } from './ladder.ts';

export interface OutlierPolicy {
  consecutiveFailures: number;
  windowRooms: number;
  minRooms: number;
  failureRate: number;
  /**
   * A failure of a pair counts against one of its engines only where the other had at least this
   * many rooms with other engines created while the two failed, failing at most half of
   * `failureRate`. Default 2.
   */
  pairEvidenceRooms: number;
  /**
   * How long each engine's rooms are kept as that evidence once they ended, and how many of them
   * at most (its own judgment reads the last `windowRooms` of them). Default 60 s and 2,000.
   */
  historyMs: number;
  historyRooms: number;
  baseEjectionMs: number;
  maxEjectionMs: number;
  maxEjectedShare: number;
  /** How long a canary through an ejected engine has to pass. */
  probeDeadlineMs: number;
}

export const DEFAULT_OUTLIER_POLICY: Readonly<OutlierPolicy> = Object.freeze({
  consecutiveFailures: 5,
  windowRooms: 20,
  minRooms: 5,
  failureRate: 0.5,
  pairEvidenceRooms: 2,
  historyMs: 60_000,
  historyRooms: 2000,
  baseEjectionMs: 10_000,
  maxEjectionMs: 300_000,
  maxEjectedShare: 0.5,
  probeDeadlineMs: 5000,
});

/** One room's end, as it bears on one of its engines. */
interface Outcome {
  failed: boolean;
  /** A failure blamed on this engine alone (not its pair). */
  own: boolean;
  /** The other engine of the room's pair. */
  with: string;
  /** When the room was created, and when it ended (unix ms). */
  from: number;
  at: number;
}

interface Record {
  /** Its rooms' outcomes of the last `historyMs` (`historyRooms` at most), newest last. */
  outcomes: Outcome[];
  /** When the newest outcome it no longer keeps ended: rooms that ended since are all kept. */
  forgotUntil: number;
  /** Failures blamed on itself in a row. */
  consecutive: number;
  /** Why its last failed room failed. */
  lastReason: string;
  times: number;
  probing: boolean;
}

export class OutlierDetector {
  private readonly engines = new Map<string, Record>();
  /**
   * The canaries sent through ejected engines: their outcome is the probe's, not a count. Each
   * maps to how its room ended, once it has.
   */
  private readonly probes = new Map<string, ProbeEnd | null>();
  private timer: Timer | null = null;
  private off: Array<() => void> = [];
  /** When each outlier that could not be spared was last logged (once a minute at most). */
  private readonly unspared = new Map<string, number>();
  private readonly policy: OutlierPolicy;

  constructor(
    private readonly control: Pick<
      ControlPlane,
      'registry' | 'onRoomEvent' | 'onRefusedClaim' | 'submit' | 'abort'
    >,
    private readonly journal: Pick<JournalLog, 'append'>,
    private readonly log: Logger,
    policy: Partial<OutlierPolicy> = {},
    private readonly clock: Clock = systemClock,
    /** When the ladder last found each engine stalled (its evidence of a fault, too). */
    private readonly ladder: Pick<EscalationLadder, 'troubledAt'> | null = null,
  ) {
    this.policy = { ...DEFAULT_OUTLIER_POLICY, ...policy };
  }

  start(intervalMs = 250): void {
    if (this.timer) return;
    this.off = [
      this.control.onRoomEvent((before, after, ev) => this.fold(before, after, ev)),
      this.control.onRefusedClaim((engine, claim) => this.claimed(engine, claim)),
    ];
    this.timer = this.clock.setInterval(() => this.tick(), intervalMs).unref();
  }

  stop(): void {
    this.clock.clear(this.timer);
    this.timer = null;
    for (const off of this.off) off();
    this.off = [];
  }

  private record(engine: string): Record {
    let r = this.engines.get(engine);
    if (!r) {
      r = {
        outcomes: [],
        forgotUntil: Number.NEGATIVE_INFINITY,
        consecutive: 0,
        times: 0,
        probing: false,
        lastReason: 'unknown',
      };
      this.engines.set(engine, r);
    }
    return r;
  }

  /** A committed room event: a room's end counts for or against the engines it ran on. */
  fold(before: Room | null, after: Room, ev: JournalEvent): void {
    const { prefillEngine: p, decodeEngine: d } = after;
    if (this.probes.has(after.room)) {
      // A canary's pair is known from its first event; how it ended, from its last.
      const ended = isTerminal(after.state);
      const reporter = ended ? ev.engine : null;
      this.probes.set(after.room, { p, d, reason: ended ? after.reason : null, reporter });
      return;
    }
    if (!isTerminal(after.state) || (before !== null && isTerminal(before.state))) return;
    const at = this.clock.now();
    const from = after.createdAt;
    const other = (e: string) => (e === p ? d : p);
    if (after.state === 'completed') {
      this.count(p, { failed: false, own: false, with: d, from, at });
      this.count(d, { failed: false, own: false, with: p, from, at });
      return;
    }
    if (after.state !== 'failed' || !isFailureReason(after.reason)) return;
    const blame = FAILURE_BLAME[after.reason].blame;
    const own = (e: string) =>
      this.count(e, { failed: true, own: true, with: other(e), from, at }, after.reason);
    if (blame === 'prefill') own(p);
    else if (blame === 'decode') own(d);
    else if (blame === 'reporter' && ev.engine !== null) own(ev.engine);
    else if (blame === 'pair') {
      this.count(p, { failed: true, own: false, with: d, from, at }, after.reason);
      this.count(d, { failed: true, own: false, with: p, from, at }, after.reason);
    }
  }

  /**
   * An engine failed its own room for a reason its role cannot detect (the control plane refused
   * it): a claim about its partner that nothing bears out, and so a failure of its own.
   */
  private claimed(engine: string, claim: RefusedClaim): void {
    if (this.probes.has(claim.room)) return;
    const at = this.clock.now();
    const why = `${claim.claim}, which it cannot have detected`;
    this.count(engine, { failed: true, own: true, with: claim.with, from: at, at }, why);
  }

  /**
   * One outcome of `engine`'s; `own`: a failure blamed on it alone (it extends its streak). The
   * engines of its role are judged again: a peer's outcome is evidence too.
   */
  private count(engine: string, o: Outcome, reason: string | null = null): void {
    const r = this.record(engine);
    r.outcomes.push(o);
    const { historyRooms, historyMs } = this.policy;
    for (let first = r.outcomes[0]; first; first = r.outcomes[0]) {
      if (r.outcomes.length <= historyRooms && first.at >= o.at - historyMs) break;
      r.forgotUntil = Math.max(r.forgotUntil, first.at);
      r.outcomes.shift();
    }
    r.consecutive = o.failed ? (o.own ? r.consecutive + 1 : r.consecutive) : 0;
    if (o.failed) r.lastReason = reason ?? 'unknown';
    for (const e of [engine, ...this.peers(engine)]) {
      const x = this.engines.get(e);
      if (x?.outcomes.at(-1)?.failed) this.judge(e, x, x.lastReason);
    }
  }

  private rate(failed: readonly boolean[]): number {
    return failed.filter(Boolean).length / failed.length;
  }

  /**
   * The engine's last outcomes that say something of it, true for each failure that counts
   * against it: its own, and those of its pair with an engine seen serving its other rooms well
   * meanwhile. A failure of its pair with an engine not seen so says nothing of it, either way:
   * it is left out (counted as a success, it would hide an engine whose every room with a healthy
   * peer fails behind those with a broken one — the bad-engine drill, with a decode engine
   * relapsing beside the corrupting prefill engine).
   */
  private against(engine: string): boolean[] {
    const outcomes = (this.engines.get(engine)?.outcomes ?? []).slice(-this.policy.windowRooms);
    // Over which span its failed rooms with each engine were created: the other one's rooms
    // created meanwhile are the evidence.
    const spans = new Map<string, { from: number; to: number }>();
    for (const o of outcomes) {
      if (!o.failed || o.own) continue;
      const span = spans.get(o.with);
      spans.set(o.with, { from: Math.min(span?.from ?? o.from, o.from), to: o.at });
    }
    const fine = new Set(
      [...spans]
        .filter(([c, span]) => !this.judged(c, span.from) && this.servesOthers(c, engine, span))
        .map(([c]) => c),
    );
    return outcomes.filter((o) => !o.failed || o.own || fine.has(o.with)).map((o) => o.failed);
  }

  /**
   * Whether the engine was judged faulty already: it is out of rotation, or the ladder found it
   * stalled since `since`. Then the rooms it queued behind its fault and served once reset say
   * nothing for it, and its pair's failures nothing against the other engine (--faults all seeds
   * 53 and 400: a stalled prefill engine reset in place looked as if it served decode-0 well, and
   * decode-1, which had met it more often, was ejected).
   */
  private judged(engine: string, since: number): boolean {
    const { ejections, cordons } = this.control.registry;
    if (ejections.has(engine) || cordons.has(engine)) return true;
    const at = this.ladder?.troubledAt(engine) ?? null;
    return at !== null && at >= since;
  }

  /**
   * Whether `engine` served its rooms with engines other than `not` well while its rooms with
   * `not` failed: at least `pairEvidenceRooms` of them were created in that span, failing at
   * most half of `failureRate` — then the fault of their pair is `not`'s. Rooms created before
   * say nothing of it, even those that ended meanwhile (their KV may have moved before the fault
   * began), nor do rooms after: a fault that began or ended meanwhile would be taken for `not`'s
   * (the simulator: --faults all seed 254; transfer-corrupt,partition,freeze seed 80;
   * transfer-corrupt,partition,freeze,kill seed 16). Nor does it say so where it may have
   * forgotten some of its rooms of the span: those it kept are the span's last, and may all be
   * after a fault ended (seed 2065296712 of --faults all at 50 rooms/s: prefill-0's window of 20
   * held two good rooms with decode-1 from the span's end, not the dozens that failed before).
   */
  private servesOthers(engine: string, not: string, span: { from: number; to: number }): boolean {
    const r = this.engines.get(engine);
    if (!r || r.forgotUntil >= span.from) return false;
    // A room created in the span ended after its start: only those need be read, newest first.
    let rooms = 0;
    let failed = 0;
    for (let i = r.outcomes.length - 1; i >= 0; i--) {
      const o = r.outcomes[i] as Outcome;
      if (o.at < span.from) break;
      if (o.with === not || o.from < span.from || o.from > span.to) continue;
      rooms++;
      if (o.failed) failed++;
    }
    return rooms >= this.policy.pairEvidenceRooms && failed / rooms <= this.policy.failureRate / 2;
  }

  /** Ejects the engine when the evidence says it is the outlier and its role can spare it. */
  private judge(engine: string, r: Record, reason: string, now = this.clock.now()): void {
    const { registry } = this.control;
    if (registry.ejections.has(engine) || registry.cordons.has(engine)) return;
    const { consecutiveFailures, minRooms, failureRate } = this.policy;
    let why: string | null = null;
    const mine = this.against(engine);
    const rate = mine.length >= minRooms ? this.rate(mine) : null;
    const peers = this.peers(engine).flatMap((e) => this.against(e));
    const peersRate = peers.length >= minRooms ? this.rate(peers) : null;
    const streak = mine.length - mine.lastIndexOf(false) - 1;
    if (r.consecutive >= consecutiveFailures)
      why = `${r.consecutive} rooms in a row failed by its fault (last: ${reason})`;
    else if (rate !== null && peersRate !== null && rate >= failureRate && peersRate <= rate / 2)
      why = `${pct(rate)} of its last ${mine.length} rooms failed (last: ${reason}), against ${pct(peersRate)} of its role's peers'`;
    else if (peersRate !== null && streak >= consecutiveFailures && peersRate <= failureRate / 2)
      why = `${streak} rooms in a row failed by its fault or its pair's (last: ${reason}), against ${pct(peersRate)} of its role's peers'`;
    if (why === null || !this.canSpare(engine)) return;
    this.eject(engine, r, why, now, { rate, peersRate });
  }

  /** The other registered engines of the engine's role. */
  private peers(engine: string): string[] {
    const all = this.control.registry.all();
    const role = all.find((s) => s.engine === engine)?.role;
    return all.filter((s) => s.role === role && s.engine !== engine).map((s) => s.engine);
  }

  /** Whether one more engine of its role may be out without passing `maxEjectedShare`. */
  private canSpare(engine: string): boolean {
    const { registry } = this.control;
    const role = [engine, ...this.peers(engine)];
    const out = role.filter((e) => registry.ejections.has(e) || registry.cordons.has(e)).length;
    const most = Math.floor(role.length * this.policy.maxEjectedShare);
    if (out + 1 <= most && out + 1 < role.length) return true;
    const now = this.clock.now();
    if (now - (this.unspared.get(engine) ?? 0) >= 60_000) {
      this.unspared.set(engine, now);
      this.log.warn(
        { engine, out, engines: role.length },
        'outlier left in rotation: ejecting it would take out more of its role than allowed',
      );
    }
    return false;
  }

  private eject(
    engine: string,
    r: Record,
    reason: string,
    now: number,
    rates: { rate: number | null; peersRate: number | null },
    /** False: out again for as long as last time, not twice as long. */
    longer = true,
  ): void {
    if (longer || r.times === 0) r.times++;
    const ejectedMs = Math.min(
      this.policy.maxEjectionMs,
      this.policy.baseEjectionMs * 2 ** (r.times - 1),
    );
    this.control.registry.ejections.set(engine, {
      reason,
      since: now,
      until: now + ejectedMs,
      times: r.times,
    });
    this.log.error(
      { engine, reason, ejectedMs, times: r.times },
      'engine ejected as an outlier: no rooms until a canary through it passes',
    );
    this.note({
      type: 'engine.ejected',
      engine,
      source: 'control',
      data: {
        reason,
        times: r.times,
        ejectedMs,
        consecutiveFailures: r.consecutive,
        ...(rates.rate !== null ? { failureRate: round(rates.rate) } : {}),
        ...(rates.peersRate !== null ? { peersFailureRate: round(rates.peersRate) } : {}),
      },
    });
  }

  /**
   * Every ejected engine whose time is up gets a canary through it; one the registry forgot (long
   * silent with no rooms) is no longer out of rotation, it is gone.
   */
  tick(now = this.clock.now()): void {
    const { registry } = this.control;
    for (const [engine, e] of registry.ejections.all()) {
      if (!registry.get(engine)) {
        registry.ejections.delete(engine);
        this.engines.delete(engine);
        this.log.info({ engine }, 'ejected engine forgotten by the registry: ejection dropped');
        continue;
      }
      const r = this.record(engine);
      if (e.until <= now && !r.probing) void this.probe(engine, r);
    }
  }

  /**
   * A canary through the ejected engine. One that fails by no fault of its own (its partner's, the
   * pair's, or a time-out) is tried once more through another partner: a lying or broken partner
   * cannot keep it out, and only a failure with two partners, or its own, doubles its time out.
   * With no other partner to try, it is out again for as long as last time.
   */
  private async probe(engine: string, r: Record): Promise<void> {
    r.probing = true;
    let canary: Canary;
    try {
      canary = await this.canary(engine, []);
      if (canary.failure !== null && !canary.own && canary.partner !== null) {
        const again = await this.canary(engine, [canary.partner]);
        canary = again.room === null ? { ...canary, undecided: true } : again;
      }
    } finally {
      r.probing = false;
    }
    const { ejections } = this.control.registry;
    if (!ejections.has(engine)) return;
    const { failure, room } = canary;
    if (failure === null) {
      ejections.delete(engine);
      r.outcomes = [];
      r.forgotUntil = this.clock.now();
      r.consecutive = 0;
      this.log.warn(
        { engine, canaryRoom: room },
        'ejected engine back in rotation: its canary passed',
      );
      this.note({
        type: 'engine.returned',
        engine,
        source: 'control',
        data: { reason: 'a canary through it passed', ...(room ? { canaryRoom: room } : {}) },
      });
      return;
    }
    ejections.delete(engine);
    const why = canary.undecided
      ? `its canary failed with ${canary.partner} (${failure}), and no other partner was free to try`
      : `its canary failed: ${failure}`;
    this.eject(
      engine,
      r,
      why,
      this.clock.now(),
      { rate: null, peersRate: null },
      !canary.undecided,
    );
  }

  /** One canary room through `engine`, not through `avoid`, to its end or its deadline. */
  private async canary(engine: string, avoid: string[]): Promise<Canary> {
    let room: string | null = null;
    let failure: string | null = null;
    try {
      const stream = this.control.submit({
        prompt: 'canary',
        maxTokens: 1,
        source: 'canary',
        probe: engine,
        ...(avoid.length > 0 ? { probeAvoid: avoid } : {}),
      });
      room = stream.room;
      this.probes.set(room, null);
      let timer: Timer | undefined;
      const deadline = new Promise<'deadline'>((resolve) => {
        timer = this.clock.setTimeout(() => resolve('deadline'), this.policy.probeDeadlineMs);
      });
      const outcome = await Promise.race([stream.result.then(() => 'ok' as const), deadline]);
      this.clock.clear(timer);
      if (outcome === 'deadline') {
        failure = `no answer within ${this.policy.probeDeadlineMs} ms`;
        void this.control.abort(stream.room, 'canary_deadline', 'canary').catch(() => {});
      }
    } catch (err) {
      failure = (err as Error).message;
    }
    const end = room === null ? null : (this.probes.get(room) ?? null);
    if (room !== null) this.probes.delete(room);
    const partner = end === null ? null : end.p === engine ? end.d : end.p;
    return {
      room,
      failure,
      partner,
      own: end !== null && ownFailure(engine, end),
      undecided: false,
    };
  }

  private note(event: Parameters<JournalLog['append']>[0]): void {
    this.journal
      .append(event)
      .catch((err) => this.log.error({ err, event: event.type }, 'could not journal an ejection'));
  }
}

/** How a canary room through an ejected engine ended. */
interface ProbeEnd {
  p: string;
  d: string;
  reason: string | null;
  /** The engine that appended its end (null: the control plane). */
  reporter: string | null;
}

interface Canary {
  room: string | null;
  failure: string | null;
  /** The other engine of its room (null: no room was made). */
  partner: string | null;
  /** Failed by a fault the engine reported of itself. */
  own: boolean;
  /** Failed with one partner, and no other could be tried. */
  undecided: boolean;
}

/** Whether the room failed by `engine`'s fault, by its own report (reasons.ts `FAILURE_BLAME`). */
function ownFailure(engine: string, end: ProbeEnd): boolean {
  if (end.reporter !== engine || !isFailureReason(end.reason)) return false;
  const blame = FAILURE_BLAME[end.reason].blame;
  const role = engine === end.p ? 'prefill' : 'decode';
  return blame === 'reporter' || blame === role;
}

function pct(x: number): string {
  return `${Math.round(x * 100)} %`;
}

function round(x: number): number {
  return Math.round(x * 1000) / 1000;
}
