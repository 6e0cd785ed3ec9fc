/**
 * Outlier ejection's decisions on committed room outcomes, with a real registry and stand-ins for
 * the control plane's events and canaries (the whole path, through real engines, is in
 * test/attacks/ and `pdctl drill bad-engine`).
 */
import { describe, expect, it } from 'vitest';
import { engineSession } from '../../test/helpers/engine-session.ts';
import type { ControlPlane } from '../control/control-plane.ts';
import type { RefusedClaim } from '../control/engines/appends.ts';
import { EngineRegistry } from '../control/engines/registry.ts';
import { silentLogger } from '../log.ts';
import type { EventInput, JournalEvent } from '../room/events.ts';
import type { Room } from '../room/reducer.ts';
import { VirtualClock } from '../sim/world/clock.ts';
import { OutlierDetector, type OutlierPolicy } from './outliers.ts';

type Listener = (before: Room | null, after: Room, ev: JournalEvent) => void;

class Rig {
  readonly registry = new EngineRegistry();
  readonly events: EventInput[] = [];
  readonly probes: string[] = [];
  /** The partners each canary was to avoid. */
  readonly avoided: string[][] = [];
  /** How the next canary ends: null passes, a string fails with it. */
  canary: string | null = null;
  /**
   * Where the next canaries run and who ends them: with no entry, the room has no events (a
   * control plane that made it and heard nothing of it). `reporter` appends its failure.
   */
  readonly canaryRooms: Array<{ p: string; d: string; reporter: string; fail?: string | null }> =
    [];
  /** A canary that must avoid a partner finds none (submit throws, as the intake does). */
  noOtherPartner = false;
  private listener: Listener | null = null;
  private refused: ((engine: string, claim: RefusedClaim) => void) | null = null;
  private n = 0;
  readonly detector: OutlierDetector;

  /** Rooms end on this clock; the test moves it. */
  readonly clock = new VirtualClock();
  /** When the ladder last found each engine stalled. */
  readonly troubled = new Map<string, number>();

  constructor(
    prefills = ['prefill-0', 'prefill-1'],
    decodes = ['decode-0'],
    policy: Partial<OutlierPolicy> = {},
  ) {
    for (const e of prefills) this.registry.set(engineSession(e, 'prefill'));
    for (const e of decodes) this.registry.set(engineSession(e, 'decode'));
    const control = {
      registry: this.registry,
      onRoomEvent: (l: Listener) => {
        this.listener = l;
        return () => {};
      },
      onRefusedClaim: (l: (engine: string, claim: RefusedClaim) => void) => {
        this.refused = l;
        return () => {};
      },
      submit: (req: { probe?: string; probeAvoid?: string[] }) => {
        this.probes.push(req.probe ?? '');
        this.avoided.push(req.probeAvoid ?? []);
        const room = `r-probe-${this.probes.length}`;
        if (this.noOtherPartner && (req.probeAvoid?.length ?? 0) > 0) {
          throw new Error('no decode engine is free to pair with');
        }
        const where = this.canaryRooms.shift();
        const fail = where?.fail !== undefined ? where.fail : this.canary;
        // Its events are committed after submit returns, and before its stream ends.
        const result = Promise.resolve().then(() => {
          if (where) this.emit(room, where.p, where.d, fail, where.reporter);
          if (fail !== null) throw new Error(fail);
          return {};
        });
        return { room, result };
      },
      abort: async () => ({}),
    } as unknown as Pick<
      ControlPlane,
      'registry' | 'onRoomEvent' | 'onRefusedClaim' | 'submit' | 'abort'
    >;
    const journal = {
      append: async (ev: EventInput) => {
        this.events.push(ev);
        return { status: 'applied' as const, seq: this.events.length, eventId: '', state: null };
      },
    };
    this.detector = new OutlierDetector(control, journal, silentLogger, policy, this.clock, {
      troubledAt: (engine) => this.troubled.get(engine) ?? null,
    });
    this.detector.start(60_000);
  }

  /**
   * A room on `p`/`d` that ended `state` now (a failure for `reason`), appended by `engine`; it
   * was created 100 ms before.
   */
  end(p: string, d: string, state: 'completed' | 'failed', reason: string | null = null): void {
    const room = {
      room: `r-${++this.n}`,
      prefillEngine: p,
      decodeEngine: d,
      state,
      reason,
      origin: 'api',
      createdAt: this.clock.now() - 100,
    };
    const before = { ...room, state: 'decoding' } as unknown as Room;
    const ev = {
      type: `room.${state}`,
      engine: reason === 'prefill_error' ? p : d,
    } as JournalEvent;
    this.listener?.(before, room as unknown as Room, ev);
  }

  /** A room's first event and its end (`fail` null: completed), as the control plane tells them. */
  private emit(room: string, p: string, d: string, fail: string | null, reporter: string): void {
    const base = { room, prefillEngine: p, decodeEngine: d, origin: 'canary', reason: null };
    const created = { ...base, state: 'created', createdAt: this.clock.now() } as unknown as Room;
    this.listener?.(null, created, { type: 'room.created', engine: null } as JournalEvent);
    const state = fail === null ? 'completed' : 'failed';
    const ended = { ...created, state, reason: fail } as unknown as Room;
    this.listener?.(created, ended, { type: `room.${state}`, engine: reporter } as JournalEvent);
  }

  /** `engine` failed its room with `other` for a reason its role cannot detect (refused). */
  claim(engine: string, other: string, claim: string): void {
    this.refused?.(engine, { room: `r-${++this.n}`, claim, with: other });
  }

  ejected(): Array<[string, Record<string, unknown>]> {
    return this.events
      .filter((e) => e.type === 'engine.ejected')
      .map((e) => [String(e.engine), e.data as Record<string, unknown>]);
  }
}

describe('OutlierDetector', () => {
  it('ejects the prefill engine whose transfers all fail while its peer succeeds, and not their one decode engine', () => {
    const rig = new Rig();
    for (let i = 0; i < 6; i++) {
      rig.end('prefill-0', 'decode-0', 'completed');
      rig.end('prefill-1', 'decode-0', 'failed', 'kv_checksum_mismatch');
    }
    expect(rig.ejected()).toEqual([
      [
        'prefill-1',
        expect.objectContaining({
          reason:
            "100 % of its last 5 rooms failed (last: kv_checksum_mismatch), against 0 % of its role's peers'",
          failureRate: 1,
          peersFailureRate: 0,
          times: 1,
          ejectedMs: 10_000,
        }),
      ],
    ]);
    expect(rig.registry.ejections.has('prefill-1')).toBe(true);
    expect(rig.registry.ejections.has('decode-0')).toBe(false);
    // Out of rotation: no room goes to it, but a canary for it does.
    const live = { staleAfterMs: 3000, stalledAfterMs: 5000 };
    expect(rig.registry.candidates('prefill', live).map((s) => s.engine)).toEqual(['prefill-0']);
    expect(
      rig.registry
        .candidates('prefill', live, Date.now(), () => true, 'prefill-1')
        .map((s) => s.engine),
    ).toEqual(['prefill-1']);
  });

  it('ejects no engine for faults of pairs it cannot tell apart: both prefill engines corrupting, one decode engine meeting them more (simulator, --faults all seed 44)', () => {
    const rig = new Rig(['prefill-0', 'prefill-1'], ['decode-0', 'decode-1']);
    // While both prefill engines corrupt what they send, decode-0 gets most of the rooms…
    for (let i = 0; i < 6; i++) {
      rig.clock.advance(50);
      rig.end(`prefill-${i % 2}`, 'decode-0', 'failed', 'kv_checksum_mismatch');
      rig.end(`prefill-${(i + 1) % 2}`, 'decode-0', 'failed', 'kv_checksum_mismatch');
      if (i % 3 === 0) rig.end(`prefill-${i % 2}`, 'decode-1', 'failed', 'kv_checksum_mismatch');
    }
    // …then the fault ends, and decode-1's next rooms are served by both.
    for (let i = 0; i < 4; i++) {
      rig.clock.advance(50);
      rig.end(`prefill-${i % 2}`, 'decode-1', 'completed');
    }
    expect(rig.ejected()).toEqual([]);
  });

  it('ejects neither engine of the one pair left serving when its rooms fail, the pair’s fault: nothing says which (simulator, --faults transfer-corrupt,partition,freeze seed 80)', () => {
    const rig = new Rig(['prefill-0', 'prefill-1'], ['decode-0', 'decode-1']);
    // Before the fault each prefill engine serves a decode engine well…
    for (let i = 0; i < 8; i++) {
      rig.clock.advance(50);
      rig.end('prefill-1', 'decode-0', 'completed');
      rig.end('prefill-0', 'decode-1', 'completed');
    }
    // …then prefill-1 corrupts, prefill-0 and decode-0 are cut off: every room is prefill-1's
    // with decode-1, and half of them fail. Rooms created before say nothing of either engine
    // now; counted against both (as before), decode-1 was ejected.
    for (let i = 0; i < 20; i++) {
      rig.clock.advance(50);
      const failed = i % 2 === 0;
      rig.end(
        'prefill-1',
        'decode-1',
        failed ? 'failed' : 'completed',
        failed ? 'kv_checksum_mismatch' : null,
      );
    }
    expect(rig.ejected()).toEqual([]);
  });

  it('ejects an engine whose rooms began failing after a window of good ones on the fifth in a row, not the tenth (the bad-engine drill)', () => {
    const rig = new Rig(['prefill-0', 'prefill-1'], ['decode-0', 'decode-1']);
    for (let i = 0; i < 20; i++) {
      rig.clock.advance(50);
      rig.end(`prefill-${i % 2}`, `decode-${i % 2}`, 'completed');
    }
    // Then every transfer of prefill-1 arrives corrupted, and routing sends it a room now and
    // then, while the rest serve well.
    for (let i = 0; i < 5; i++) {
      expect(rig.ejected()).toEqual([]);
      for (let j = 0; j < 4; j++) {
        rig.clock.advance(50);
        rig.end('prefill-0', `decode-${j % 2}`, 'completed');
      }
      rig.end('prefill-1', 'decode-0', 'failed', 'kv_checksum_mismatch');
    }
    expect(rig.ejected()).toEqual([
      [
        'prefill-1',
        expect.objectContaining({
          reason:
            "5 rooms in a row failed by its fault or its pair's (last: kv_checksum_mismatch), against 0 % of its role's peers'",
          failureRate: 0.333,
        }),
      ],
    ]);
    expect(rig.registry.ejections.has('decode-0')).toBe(false);
  });

  it('ejects no engine for the rooms of one the ladder found stalled, though its rooms queued behind the stall completed once it was reset (simulator, --faults all seeds 53 and 400)', () => {
    const stalledPrefill = (ladderSaw: boolean) => {
      const rig = new Rig(['prefill-0', 'prefill-1'], ['decode-0', 'decode-1']);
      for (let i = 0; i < 10; i++) {
        rig.clock.advance(50);
        rig.end('prefill-1', `decode-${i % 2}`, 'completed');
      }
      // prefill-0's transfers stall; the ladder resets it in place: its transfers to decode-1
      // are cancelled, and its rooms with decode-0 then complete.
      rig.clock.advance(1000);
      if (ladderSaw) rig.troubled.set('prefill-0', rig.clock.now());
      for (let i = 0; i < 5; i++) rig.end('prefill-0', 'decode-1', 'failed', 'transfer_cancelled');
      for (let i = 0; i < 3; i++) rig.end('prefill-0', 'decode-0', 'completed');
      rig.end('prefill-0', 'decode-1', 'failed', 'transfer_cancelled');
      return rig.ejected().map(([e]) => e);
    };
    expect(stalledPrefill(true)).toEqual([]);
    // Without the ladder's word, prefill-0 looks as if it served decode-0 well meanwhile.
    expect(stalledPrefill(false)).toEqual(['decode-1']);
  });

  it('ejects no decode engine for a prefill engine’s fault because that one’s last rooms, after the fault, went well (simulator, --faults all seed 2065296712 at 50 rooms/s)', () => {
    const afterFault = (policy: Partial<OutlierPolicy>) => {
      const rig = new Rig(['prefill-0', 'prefill-1'], ['decode-0', 'decode-1'], policy);
      // prefill-1 is out already; prefill-0 corrupts every transfer to either decode engine…
      rig.registry.ejections.set('prefill-1', { reason: 'x', since: 0, until: 1e15, times: 1 });
      for (let i = 0; i < 40; i++) {
        rig.clock.advance(10);
        rig.end('prefill-0', `decode-${i % 2}`, 'failed', 'kv_checksum_mismatch');
      }
      // …until it heals, and its next rooms all go to decode-1 and complete: its last 20 are
      // good ones, a few of them created before decode-0's last failure.
      for (let i = 0; i < 20; i++) {
        rig.clock.advance(10);
        rig.end('prefill-0', 'decode-1', 'completed');
      }
      return rig.ejected().map(([e]) => e);
    };
    // It keeps enough of its rooms to see that it failed with decode-1 too…
    expect(afterFault({})).toEqual([]);
    // …and where it kept no more than its window, it knows it forgot those.
    expect(afterFault({ historyRooms: 20 })).toEqual([]);
  });

  it('ejects an engine on its fifth failure in a row of its own', () => {
    const rig = new Rig();
    for (let i = 0; i < 4; i++) rig.end('prefill-1', 'decode-0', 'failed', 'prefill_error');
    expect(rig.ejected()).toEqual([]);
    rig.end('prefill-1', 'decode-0', 'failed', 'prefill_error');
    expect(rig.ejected()[0]?.[1]).toMatchObject({
      reason: '5 rooms in a row failed by its fault (last: prefill_error)',
      consecutiveFailures: 5,
    });
  });

  it('never takes out more than half of a role, nor its last engine: a fault they share ejects one at most', () => {
    const rig = new Rig(['prefill-0', 'prefill-1'], ['decode-0']);
    for (let i = 0; i < 8; i++) {
      rig.end('prefill-0', 'decode-0', 'failed', 'prefill_error');
      rig.end('prefill-1', 'decode-0', 'failed', 'prefill_error');
    }
    expect(rig.ejected().map(([e]) => e)).toEqual(['prefill-0']);
    expect(rig.registry.ejections.all().size).toBe(1);
  });

  it('brings an engine back when a canary through it passes, and ejects it longer when one fails', async () => {
    const rig = new Rig();
    for (let i = 0; i < 5; i++) rig.end('prefill-1', 'decode-0', 'failed', 'prefill_error');
    const first = rig.registry.ejections.of('prefill-1');
    if (!first) throw new Error('not ejected');
    rig.detector.tick(first.until - 1);
    expect(rig.probes).toEqual([]);
    rig.canary = 'prefill_error';
    rig.detector.tick(first.until);
    await new Promise((r) => setImmediate(r));
    expect(rig.probes).toEqual(['prefill-1']);
    const second = rig.registry.ejections.of('prefill-1');
    expect(second).toMatchObject({ times: 2, reason: 'its canary failed: prefill_error' });
    expect(rig.ejected()[1]?.[1]).toMatchObject({ ejectedMs: 20_000, times: 2 });
    rig.canary = null;
    rig.detector.tick(second?.until ?? 0);
    await new Promise((r) => setImmediate(r));
    expect(rig.registry.ejections.has('prefill-1')).toBe(false);
    expect(rig.events.at(-1)).toMatchObject({
      type: 'engine.returned',
      engine: 'prefill-1',
      data: { reason: 'a canary through it passed', canaryRoom: 'r-probe-2' },
    });
  });

  it('ejects the decode engine that fails its rooms for faults only prefill engines can detect, and neither prefill engine it named', () => {
    const rig = new Rig(['prefill-0', 'prefill-1'], ['decode-0', 'decode-1']);
    for (let i = 0; i < 12; i++) {
      rig.clock.advance(50);
      rig.end(`prefill-${i % 2}`, 'decode-0', 'completed');
      // decode-1 says the prefill engine failed: refused, and the claim is decode-1's.
      rig.claim('decode-1', `prefill-${i % 2}`, 'prefill_error');
    }
    expect(rig.ejected()).toEqual([
      [
        'decode-1',
        expect.objectContaining({
          reason:
            '5 rooms in a row failed by its fault (last: prefill_error, which it cannot have detected)',
        }),
      ],
    ]);
    expect(rig.registry.ejections.has('prefill-0')).toBe(false);
    expect(rig.registry.ejections.has('prefill-1')).toBe(false);
  });

  it("tries a canary that failed by its partner's word once more through another partner, and brings the engine back when that one passes", async () => {
    const rig = new Rig(['prefill-0', 'prefill-1'], ['decode-0', 'decode-1']);
    for (let i = 0; i < 5; i++) rig.end('prefill-1', 'decode-0', 'failed', 'prefill_error');
    const first = rig.registry.ejections.of('prefill-1');
    if (!first) throw new Error('not ejected');
    // Its first canary goes to decode-1, which says the KV arrived corrupted; its second, to
    // decode-0, passes.
    rig.canaryRooms.push(
      { p: 'prefill-1', d: 'decode-1', reporter: 'decode-1', fail: 'kv_checksum_mismatch' },
      { p: 'prefill-1', d: 'decode-0', reporter: 'decode-0', fail: null },
    );
    rig.detector.tick(first.until);
    await new Promise((r) => setImmediate(r));
    expect(rig.probes).toEqual(['prefill-1', 'prefill-1']);
    expect(rig.avoided).toEqual([[], ['decode-1']]);
    expect(rig.registry.ejections.has('prefill-1')).toBe(false);
    expect(rig.events.at(-1)).toMatchObject({ type: 'engine.returned', engine: 'prefill-1' });
  });

  it('ejects an engine for as long as last time, not twice, when its canary failed by its partner and no other partner was free', async () => {
    const rig = new Rig(['prefill-0', 'prefill-1'], ['decode-0']);
    for (let i = 0; i < 5; i++) rig.end('prefill-1', 'decode-0', 'failed', 'prefill_error');
    const first = rig.registry.ejections.of('prefill-1');
    if (!first) throw new Error('not ejected');
    rig.canary = 'kv_checksum_mismatch';
    rig.canaryRooms.push({ p: 'prefill-1', d: 'decode-0', reporter: 'decode-0' });
    rig.noOtherPartner = true;
    rig.detector.tick(first.until);
    await new Promise((r) => setImmediate(r));
    expect(rig.avoided).toEqual([[], ['decode-0']]);
    expect(rig.ejected()[1]?.[1]).toMatchObject({
      reason:
        'its canary failed with decode-0 (kv_checksum_mismatch), and no other partner was free to try',
      ejectedMs: 10_000,
      times: 1,
    });
    // A failure it reports of itself doubles its time out, with no second try.
    const second = rig.registry.ejections.of('prefill-1');
    rig.canary = 'prefill_error';
    rig.canaryRooms.push({ p: 'prefill-1', d: 'decode-0', reporter: 'prefill-1' });
    rig.detector.tick(second?.until ?? 0);
    await new Promise((r) => setImmediate(r));
    expect(rig.avoided).toHaveLength(3);
    expect(rig.ejected()[2]?.[1]).toMatchObject({
      reason: 'its canary failed: prefill_error',
      ejectedMs: 20_000,
      times: 2,
    });
  });

  it('drops the ejection of an engine the registry forgot', () => {
    const rig = new Rig();
    for (let i = 0; i < 5; i++) rig.end('prefill-1', 'decode-0', 'failed', 'prefill_error');
    expect(rig.registry.ejections.has('prefill-1')).toBe(true);
    rig.registry.delete('prefill-1');
    rig.detector.tick(Date.now());
    expect(rig.registry.ejections.has('prefill-1')).toBe(false);
    expect(rig.probes).toEqual([]);
  });
});
