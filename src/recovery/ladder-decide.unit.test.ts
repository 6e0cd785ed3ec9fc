/**
 * The ladder's decisions, given/when/then on data: where each engine stands, what one tick sees,
 * and the commands that come out — no control plane, no supervisor, no clock.
 */
import { describe, expect, it } from 'vitest';
import { DEFAULT_LIVENESS, type EngineView } from '../control/engines/engine-view.ts';
import type { Stall } from '../control/evidence/stalls.ts';
import {
  DEFAULT_LADDER_POLICY,
  decideLadder,
  type EngineLadder,
  type LadderCommand,
  type LadderState,
  type LadderTick,
} from './ladder-decide.ts';

const T0 = 1_000_000;

/** An engine as the control plane shows it, beating on time unless told otherwise. */
function view(engine: string, more: Partial<EngineView> = {}): EngineView {
  return {
    engine,
    incarnation: 'i1',
    status: 'live',
    session: 1,
    beats: 5,
    lastSeen: T0,
    ...more,
  } as EngineView;
}

function tick(now: number, engines: EngineView[], more: Partial<LadderTick> = {}): LadderTick {
  return {
    now,
    engines,
    stalls: [],
    listeningSince: 0,
    liveness: DEFAULT_LIVENESS,
    supervised: new Set(engines.map((e) => e.engine)),
    stack: ['p0', 'd0'],
    journalWritable: true,
    ...more,
  };
}

const stall = (engine: string, kind: Stall['kind'] = 'work'): Stall => ({
  engine,
  kind,
  reason: `${kind} stall`,
  since: T0 - 3000,
});

/** The commands as short strings: `journal engine.stalled`, `rung d0 reset_in_place`. */
function said(commands: LadderCommand[]): string[] {
  return commands.flatMap((c) =>
    c.kind === 'journal'
      ? [
          `journal ${c.event.type}${c.event.type === 'recovery.action' ? ` ${String(c.event.data.action)}: ${String(c.event.data.outcome)}` : ''}`,
        ]
      : c.kind === 'rung'
        ? [`rung ${c.engine} ${c.rung}${c.restart.length > 0 ? ` (${c.restart.join(', ')})` : ''}`]
        : [],
  );
}

const P = DEFAULT_LADDER_POLICY;

/** Where an engine stands after being found stalled at `at` and reset in place then. */
function resetting(at: number, more: Partial<EngineLadder> = {}): LadderState {
  const first = decideLadder(new Map(), tick(at, [view('d0')], { stalls: [stall('d0')] }), P);
  const l = first.state.get('d0') as EngineLadder;
  return new Map([['d0', { ...l, ...more }]]);
}

describe('decideLadder: an engine declared stalled goes up the ladder a rung at a time', () => {
  it('given an engine serving, when a stall is found, then the incident opens and it is reset in place', () => {
    const d = decideLadder(new Map(), tick(T0, [view('d0')], { stalls: [stall('d0')] }), P);
    expect(said(d.commands)).toEqual(['journal engine.stalled', 'rung d0 reset_in_place']);
    expect(d.acted).toEqual(['d0:reset_in_place']);
    expect(d.state.get('d0')).toMatchObject({ phase: 'resetting', resets: 1 });
    const rung = d.commands.find((c) => c.kind === 'rung');
    expect(rung).toMatchObject({ reason: 'work stall', detectMs: 3000, incarnation: 'i1' });
  });

  it('given a reset in place, when the grace has not passed, then nothing; when it has, it failed and the engine is restarted', () => {
    const s = resetting(T0);
    const still = [view('d0')];
    const stalls = [stall('d0')];
    expect(decideLadder(s, tick(T0 + 1000, still, { stalls }), P).commands).toEqual([]);
    const d = decideLadder(s, tick(T0 + P.resetGraceMs, still, { stalls }), P);
    expect(said(d.commands)).toEqual([
      'journal recovery.action reset_in_place: failed: not serving 2000 ms after reset_in_place',
      'rung d0 restart_engine (d0)',
    ]);
    expect(d.state.get('d0')).toMatchObject({ phase: 'restarting', restarts: 1 });
  });

  it('given a reset in place, when a new session beats and nothing is stalled, then the incident closes', () => {
    const s = resetting(T0);
    const d = decideLadder(s, tick(T0 + 500, [view('d0', { session: 2, lastSeen: T0 + 400 })]), P);
    expect(said(d.commands)).toEqual([
      'journal recovery.action reset_in_place: recovered',
      'journal engine.recovered',
    ]);
    expect(d.state.get('d0')).toMatchObject({
      phase: 'ok',
      incident: null,
      lastRecovery: { kind: 'work', rung: 'reset_in_place', at: T0 + 500 },
    });
    // The same session is not a recovery: the reset has not happened yet.
    expect(decideLadder(s, tick(T0 + 500, [view('d0')]), P).commands).toEqual([]);
  });

  it('given a recent recovery, when the same stall comes back, then it starts a rung above the one that worked', () => {
    const recoveredAt = T0 - 10_000;
    const s: LadderState = new Map([
      [
        'd0',
        {
          ...(resetting(T0).get('d0') as EngineLadder),
          phase: 'ok',
          incident: null,
          lastRecovery: { kind: 'work', rung: 'reset_in_place', at: recoveredAt },
        },
      ],
    ]);
    const d = decideLadder(s, tick(T0, [view('d0')], { stalls: [stall('d0')] }), P);
    expect(said(d.commands)).toEqual(['journal engine.stalled', 'rung d0 restart_engine (d0)']);
    const stalled = d.commands[0] as Extract<LadderCommand, { kind: 'journal' }>;
    expect(stalled.event.data).toEqual({
      reason: 'work stall (again 10 s after reset_in_place brought it back)',
    });
    // Another kind of stall starts from the bottom.
    const other = decideLadder(s, tick(T0, [view('d0')], { stalls: [stall('d0', 'bus')] }), P);
    expect(other.acted).toEqual(['d0:reset_in_place']);
  });

  it('given a restart that did not cure it, then it alone is cordoned — or, with another engine stalled in the window, the stack restarts', () => {
    const restarted: LadderState = new Map([
      [
        'd0',
        {
          ...(resetting(T0).get('d0') as EngineLadder),
          phase: 'restarting',
          restarts: 1,
          restartTimes: [T0],
          incident: {
            ...((resetting(T0).get('d0') as EngineLadder).incident as NonNullable<
              EngineLadder['incident']
            >),
            rung: 'restart_engine',
            actedAt: T0,
          },
        },
      ],
    ]);
    const late = T0 + P.restartGraceMs;
    const stalls = [stall('d0')];
    const beating = [view('d0', { lastSeen: late }), view('p0', { lastSeen: late })];
    const alone = decideLadder(restarted, tick(late, beating, { stalls }), P);
    expect(said(alone.commands).slice(-1)).toEqual(['rung d0 cordon_engine']);
    expect(alone.commands.at(-1)).toMatchObject({
      evidence: 'd0 alone stalled within 60 s, and a restart did not cure it: the fault is its own',
      stalled: ['d0'],
    });
    const both = new Map(restarted).set('p0', {
      ...(restarted.get('d0') as EngineLadder),
      phase: 'ok',
      incident: null,
      lastRecovery: { kind: 'bus', rung: 'reset_in_place', at: late - 5000 },
    });
    const shared = decideLadder(both, tick(late, beating, { stalls }), P);
    expect(said(shared.commands).slice(-1)).toEqual(['rung d0 restart_stack (p0, d0)']);
    expect(shared.commands.at(-1)).toMatchObject({ stalled: ['d0', 'p0'] });
  });

  it('given the restart cap reached, then it gives up and says why', () => {
    const s = resetting(T0, { restartTimes: [T0 - 3000, T0 - 2000, T0 - 1000] });
    const d = decideLadder(
      s,
      tick(T0 + P.resetGraceMs, [view('d0')], { stalls: [stall('d0')] }),
      P,
    );
    expect(said(d.commands).slice(-1)).toEqual([
      'journal recovery.action give_up: restart cap reached (3 in 600 s)',
    ]);
    expect(d.state.get('d0')?.phase).toBe('gave_up');
  });

  it('given an engine it did not start, when it falls silent, then it is fenced at once; where it would be restarted, fenced too', () => {
    const silent = view('d0', { lastSeen: T0 - 6000 });
    const d = decideLadder(new Map(), tick(T0, [silent], { supervised: new Set() }), P);
    expect(said(d.commands)).toEqual(['journal engine.stalled', 'rung d0 fence_engine']);
    // Not silent since this process has been listening only 1 s: no engine is blamed for that.
    const paused = tick(T0, [silent], { supervised: new Set(), listeningSince: T0 - 1000 });
    expect(decideLadder(new Map(), paused, P).commands).toEqual([]);
    const s = resetting(T0);
    const notOurs = tick(T0 + P.resetGraceMs, [view('d0')], {
      stalls: [stall('d0')],
      supervised: new Set(),
    });
    expect(said(decideLadder(s, notOurs, P).commands).slice(-1)).toEqual(['rung d0 fence_engine']);
  });

  it('given a journal that refuses writes, then nothing above the in-place reset is tried until it takes them', () => {
    const refused = { journalWritable: false };
    // A reset that did not work waits at its rung: the restart is made once it can be recorded.
    const s = resetting(T0);
    const held = tick(T0 + P.resetGraceMs, [view('d0')], { stalls: [stall('d0')], ...refused });
    expect(decideLadder(s, held, P).commands).toEqual([]);
    const writable = tick(T0 + 10_000, [view('d0')], { stalls: [stall('d0')] });
    expect(said(decideLadder(s, writable, P).commands).slice(-1)).toEqual([
      'rung d0 restart_engine (d0)',
    ]);
    // A relapse is reset in place rather than restarted.
    const ok: LadderState = new Map([
      [
        'd0',
        {
          ...(s.get('d0') as EngineLadder),
          phase: 'ok',
          incident: null,
          lastRecovery: { kind: 'work', rung: 'restart_engine', at: T0 - 5000 },
        },
      ],
    ]);
    const relapse = tick(T0, [view('d0')], { stalls: [stall('d0')], ...refused });
    expect(decideLadder(ok, relapse, P).acted).toEqual(['d0:reset_in_place']);
    // A silent engine not ours, which only a fence would reach, waits for the journal.
    const silent = tick(T0, [view('d0', { lastSeen: T0 - 6000 })], {
      supervised: new Set(),
      ...refused,
    });
    expect(decideLadder(new Map(), silent, P).commands).toEqual([]);
  });

  it('leaves the state it was given as it was', () => {
    const s = resetting(T0);
    const before = JSON.stringify([...s]);
    decideLadder(s, tick(T0 + P.resetGraceMs, [view('d0')], { stalls: [stall('d0')] }), P);
    expect(JSON.stringify([...s])).toBe(before);
  });
});
