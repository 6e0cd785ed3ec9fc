/**
 * The ladder's decisions, tick by tick, on a clock the test moves. The control plane and the
 * supervisor are stand-ins that record what the ladder asked of them (the real ones, and the
 * engines they run, are exercised end to end in test/recovery.e2e.test.ts and the drills).
 */
import { describe, expect, it, vi } from 'vitest';
import type { ControlPlane } from '../control/control-plane.ts';
import {
  DEFAULT_LIVENESS,
  type EngineStatus,
  type EngineView,
} from '../control/engines/engine-view.ts';
import { Cordons } from '../control/evidence/cordons.ts';
import type { Stall, StallKind } from '../control/evidence/stalls.ts';
import type { JournalHealth } from '../journal/store.ts';
import { processLogger } from '../log.ts';
import type { EventInput } from '../room/events.ts';
import { EscalationLadder } from './ladder.ts';
import type { Supervisor } from './supervisor.ts';

const ENGINE = 'prefill-0';

class Rig {
  /** The engine as the control plane's view shows it (only what the ladder reads). */
  session = {
    engine: ENGINE,
    incarnation: 'i1',
    status: 'live' as EngineStatus,
    session: 1,
    beats: 5,
    lastSeen: Number.NaN,
  };
  /** Whether the engine is a process the supervisor started. */
  supervised = true;
  stall: StallKind | null = null;
  /** decode-0, stalled when `otherStall` is set (it heartbeats on time otherwise). */
  other = { ...this.session, engine: 'decode-0', lastSeen: Number.NaN };
  otherStall: StallKind | null = null;
  /** Whether the journal says it takes writes. */
  writable = true;
  /** Whether an append throws (the journal refuses before it says so). */
  refusing = false;
  /** What the ladder last told the detectors of its own gaps (stalledEngines' `lateAt`). */
  lateAt = -1;
  readonly cordons = new Cordons();
  readonly events: EventInput[] = [];
  readonly asked: string[] = [];
  readonly ladder: EscalationLadder;
  now = 1_000_000;

  constructor() {
    const control: Pick<
      ControlPlane,
      'engines' | 'stalledEngines' | 'command' | 'fence' | 'liveness' | 'registry' | 'book'
    > = {
      liveness: DEFAULT_LIVENESS,
      engines: () => [this.session, this.other] as unknown as EngineView[],
      stalledEngines: (_policy, _now, lateAt = 0): Stall[] => {
        this.lateAt = lateAt;
        return [
          ...(this.stall
            ? [{ engine: ENGINE, kind: this.stall, reason: `${this.stall} stall`, since: this.now }]
            : []),
          ...(this.otherStall
            ? [
                {
                  engine: 'decode-0',
                  kind: this.otherStall,
                  reason: `${this.otherStall} stall`,
                  since: this.now,
                },
              ]
            : []),
        ];
      },
      registry: { cordons: this.cordons } as unknown as ControlPlane['registry'],
      book: { liveOn: () => 3 } as unknown as ControlPlane['book'],
      command: () => false,
      fence: (engine, incarnation) => {
        this.asked.push(`fence ${engine} ${incarnation}`);
        this.session.status = 'connecting';
        return true;
      },
    };
    const journal = {
      health: () => ({ writable: this.writable }) as JournalHealth,
      append: async (ev: EventInput) => {
        if (this.refusing || !this.writable) throw new Error('the disk is full');
        this.events.push(ev);
        return { status: 'applied' as const, seq: this.events.length, eventId: '', state: null };
      },
    };
    const supervisor: Supervisor = {
      pid: () => (this.supervised ? 4242 : undefined),
      ids: () => ['prefill-0', 'decode-0'],
      signal: (id, sig) => {
        if (!this.supervised) return false;
        this.asked.push(`${sig} ${id}`);
        return true;
      },
      restartNow: async (id) => {
        this.asked.push(`restart ${id}`);
        return 4343;
      },
    };
    this.ladder = new EscalationLadder(
      control,
      journal,
      supervisor,
      processLogger('test', 'silent'),
    );
  }

  /** Heartbeats on time (a new incarnation comes back live, beating). */
  beat(): void {
    this.session.lastSeen = this.now;
  }

  /** Lets the appends the last tick made commit, and the rungs waiting on them act. */
  settle(): Promise<void> {
    return new Promise((r) => setImmediate(r));
  }

  tick(advanceMs = 250): string[] {
    this.now += advanceMs;
    return this.ladder.tick(this.now);
  }

  /** The engine comes back: after an in-place reset a new session, after a restart a new process. */
  comesBack(how: 'session' | 'incarnation'): void {
    this.stall = null;
    this.session.status = 'live';
    if (!Number.isNaN(this.session.lastSeen)) this.beat();
    this.session.session++;
    if (how === 'incarnation') this.session.incarnation = `i${this.session.session}`;
  }

  actions(): string[] {
    return this.events
      .filter((e) => e.type === 'recovery.action')
      .map((e) => `${String(e.data.action)}: ${String(e.data.outcome).split(' (')[0]}`);
  }
}

describe('EscalationLadder', () => {
  it('fences a silent engine it did not start, and closes the incident when a new incarnation serves', async () => {
    const rig = new Rig();
    rig.supervised = false;
    rig.beat();
    expect(rig.tick(4000)).toEqual([]);
    // Past the heartbeat limit: nothing can reach it (no signal, no command), so its rooms move.
    expect(rig.tick(1500)).toEqual(['prefill-0:fence_engine']);
    await rig.settle();
    expect(rig.asked).toEqual(['fence prefill-0 i1']);
    expect(rig.ladder.view(ENGINE).phase).toBe('fenced');
    expect(rig.actions()).toEqual([
      'fence_engine: fenced: its rooms move to healthy pairs; it must rejoin as a new incarnation',
    ]);
    // The same incarnation beating again is not a recovery: only a new one is.
    rig.beat();
    rig.tick();
    expect(rig.ladder.view(ENGINE).phase).toBe('fenced');
    rig.comesBack('incarnation');
    rig.tick();
    expect(rig.ladder.view(ENGINE).phase).toBe('ok');
  });

  it('does not fence engines for heartbeats it missed while it was not running itself', () => {
    vi.useFakeTimers();
    try {
      const rig = new Rig();
      rig.supervised = false;
      rig.beat();
      vi.setSystemTime(rig.now);
      expect(rig.tick(100)).toEqual([]);
      // This process was stopped for 6 s (SIGSTOP, a long pause): its timer ran that late.
      vi.advanceTimersByTime(6000);
      expect(rig.tick(6000)).toEqual([]);
      // Listening again, and still no heartbeat 5 s later: now the engine is silent.
      vi.advanceTimersByTime(100);
      expect(rig.tick(4000)).toEqual([]);
      vi.advanceTimersByTime(100);
      expect(rig.tick(1100)).toEqual(['prefill-0:fence_engine']);
    } finally {
      vi.useRealTimers();
    }
  });

  it('counts every detector’s evidence only from after a pause of its own, half a second or more', () => {
    // Found by the simulator (--faults control-freeze, seed 54): a control plane stopped for 0.8 s
    // judged its engines' bus loops on SIGCONT by what it had not heard while stopped, and reset
    // two healthy engines in place.
    vi.useFakeTimers();
    try {
      const rig = new Rig();
      rig.beat();
      vi.setSystemTime(rig.now);
      rig.tick(100);
      expect(rig.lateAt).toBe(0);
      vi.advanceTimersByTime(100);
      rig.tick(100);
      expect(rig.lateAt).toBe(0);
      vi.advanceTimersByTime(800);
      rig.tick(800);
      expect(rig.lateAt).toBe(rig.now);
    } finally {
      vi.useRealTimers();
    }
  });

  it('gives up on a fenced engine that does not come back, and says where to look', () => {
    const rig = new Rig();
    rig.supervised = false;
    rig.beat();
    expect(rig.tick(5500)).toEqual(['prefill-0:fence_engine']);
    rig.tick(16_000);
    const view = rig.ladder.view(ENGINE);
    expect(view.phase).toBe('gave_up');
    expect(view.lastOutcome).toMatch(/not back as a new incarnation within 15 s/);
  });

  it('resets in place first, and a recovery closes the incident', () => {
    const rig = new Rig();
    rig.stall = 'transfer';
    expect(rig.tick()).toEqual(['prefill-0:reset_in_place']);
    expect(rig.asked).toEqual(['SIGHUP prefill-0']);
    expect(rig.ladder.view(ENGINE).phase).toBe('resetting');
    // Outlier ejection hears when the ladder last found it stalled: from the detection on…
    expect(rig.ladder.troubledAt(ENGINE)).toBe(rig.now);
    const detected = rig.now;
    rig.comesBack('session');
    rig.tick();
    expect(rig.ladder.view(ENGINE).phase).toBe('ok');
    expect(rig.events.map((e) => e.type)).toEqual([
      'engine.stalled',
      'recovery.action',
      'recovery.action',
      'engine.recovered',
    ]);
    // …to its recovery, which it keeps; an engine never found stalled has none.
    expect(rig.ladder.troubledAt(ENGINE)).toBeGreaterThan(detected);
    expect(rig.ladder.troubledAt('decode-9')).toBeNull();
  });

  it('an engine that wedges the same way again soon starts a rung higher each time, and alone is cordoned — no other engine restarted', async () => {
    const rig = new Rig();
    rig.stall = 'work';
    expect(rig.tick()).toEqual(['prefill-0:reset_in_place']);
    rig.comesBack('session');
    rig.tick();
    // Ten seconds later, the same stall: the in-place reset did not last.
    rig.stall = 'work';
    expect(rig.tick(10_000)).toEqual(['prefill-0:restart_engine']);
    const stalled = rig.events.filter((e) => e.type === 'engine.stalled');
    expect(String(stalled[1]?.data.reason)).toBe(
      'work stall (again 10 s after reset_in_place brought it back)',
    );
    rig.comesBack('incarnation');
    rig.tick();
    rig.stall = 'work';
    expect(rig.tick(5_000)).toEqual(['prefill-0:cordon_engine']);
    await rig.settle();
    // Its rooms move and its incarnation is fenced; decode-0, healthy, is left alone.
    expect(rig.asked.slice(-1)).toEqual([`fence prefill-0 ${rig.session.incarnation}`]);
    expect(rig.asked.filter((a) => a.includes('decode-0'))).toEqual([]);
    expect(rig.ladder.view(ENGINE).phase).toBe('cordoned');
    const cordoned = rig.events.find((e) => e.type === 'engine.cordoned');
    expect(cordoned).toMatchObject({
      engine: ENGINE,
      data: {
        by: 'ladder',
        rooms: 3,
        evidence:
          'prefill-0 alone stalled within 60 s, and a restart did not cure it: the fault is its own',
      },
    });
    expect(rig.cordons.of(ENGINE)?.by).toBe('ladder');
    // Still stalled: nothing more is tried on a cordoned engine.
    expect(rig.tick(20_000)).toEqual([]);
    // A new incarnation that serves closes the incident; the engine stays cordoned.
    rig.comesBack('incarnation');
    rig.tick();
    expect(rig.ladder.view(ENGINE).phase).toBe('ok');
    expect(rig.cordons.has(ENGINE)).toBe(true);
  });

  it('restarts every engine only when another engine stalled in the same window, and says why', async () => {
    const rig = new Rig();
    rig.stall = 'work';
    expect(rig.tick()).toEqual(['prefill-0:reset_in_place']);
    rig.comesBack('session');
    rig.tick();
    rig.stall = 'work';
    expect(rig.tick(10_000)).toEqual(['prefill-0:restart_engine']);
    rig.comesBack('incarnation');
    rig.tick();
    // decode-0 stalls too: what they share is suspect.
    rig.otherStall = 'bus';
    expect(rig.tick()).toEqual(['decode-0:reset_in_place']);
    rig.stall = 'work';
    const before = rig.asked.length;
    expect(rig.tick(5_000)).toContain('prefill-0:restart_stack');
    await rig.settle();
    expect(rig.asked.slice(before)).toEqual(
      expect.arrayContaining(['restart prefill-0', 'restart decode-0']),
    );
    const stack = rig.events.find(
      (e) => e.type === 'recovery.action' && e.data.action === 'restart_stack',
    );
    expect((stack?.data as { evidence?: string } | undefined)?.evidence).toBe(
      '2 engines stalled within 60 s (prefill-0, decode-0): the fault is likelier in what they share',
    );
    expect(rig.cordons.all().size).toBe(0);
  });

  it('a different stall, or the same one long after, starts again from the in-place reset', () => {
    const rig = new Rig();
    rig.stall = 'bus';
    rig.tick();
    rig.comesBack('session');
    rig.tick();
    rig.stall = 'transfer';
    expect(rig.tick(5_000)).toEqual(['prefill-0:reset_in_place']);
    rig.comesBack('session');
    rig.tick();
    rig.stall = 'transfer';
    expect(rig.tick(60_000)).toEqual(['prefill-0:reset_in_place']);
    expect(rig.actions().filter((a) => a.startsWith('reset_in_place: requested'))).toHaveLength(3);
  });

  it('restarts nothing the journal cannot record: it holds at the in-place reset until the journal takes writes', async () => {
    const rig = new Rig();
    rig.stall = 'work';
    expect(rig.tick()).toEqual(['prefill-0:reset_in_place']);
    rig.writable = false;
    expect(rig.tick(2500)).toEqual([]);
    expect(rig.tick(10_000)).toEqual([]);
    await rig.settle();
    expect(rig.asked).toEqual(['SIGHUP prefill-0']);
    rig.writable = true;
    expect(rig.tick()).toEqual(['prefill-0:restart_engine']);
    await rig.settle();
    expect(rig.asked).toEqual(['SIGHUP prefill-0', 'restart prefill-0']);
    expect(rig.actions().slice(-2)).toEqual([
      'reset_in_place: failed: not serving 2000 ms after reset_in_place',
      'restart_engine: requested',
    ]);
  });

  it('a rung whose record the journal refuses is not tried, and is tried again once it is taken', async () => {
    const rig = new Rig();
    rig.stall = 'work';
    rig.tick();
    rig.refusing = true;
    expect(rig.tick(2500)).toEqual(['prefill-0:restart_engine']);
    await rig.settle();
    expect(rig.asked).toEqual(['SIGHUP prefill-0']);
    expect(rig.ladder.view(ENGINE)).toMatchObject({ phase: 'resetting', restarts: 0 });
    rig.refusing = false;
    expect(rig.tick()).toEqual(['prefill-0:restart_engine']);
    await rig.settle();
    expect(rig.asked).toEqual(['SIGHUP prefill-0', 'restart prefill-0']);
    expect(rig.actions().filter((a) => a.startsWith('restart_engine'))).toEqual([
      'restart_engine: requested',
    ]);
  });

  it('a reset that does not bring the engine back within its grace escalates to a restart', () => {
    const rig = new Rig();
    rig.stall = 'canary';
    expect(rig.tick()).toEqual(['prefill-0:reset_in_place']);
    expect(rig.tick(1000)).toEqual([]);
    expect(rig.tick(1500)).toEqual(['prefill-0:restart_engine']);
    expect(rig.actions()).toEqual([
      'reset_in_place: requested',
      'reset_in_place: failed: not serving 2000 ms after reset_in_place',
      'restart_engine: requested',
    ]);
  });

  it('an engine it did not start is fenced where it would be restarted', async () => {
    const rig = new Rig();
    rig.supervised = false;
    rig.stall = 'work';
    expect(rig.tick()).toEqual(['prefill-0:reset_in_place']);
    expect(rig.tick(2500)).toEqual(['prefill-0:fence_engine']);
    await rig.settle();
    expect(rig.asked).toEqual(['fence prefill-0 i1']);
    expect(rig.ladder.view(ENGINE).phase).toBe('fenced');
  });
});
