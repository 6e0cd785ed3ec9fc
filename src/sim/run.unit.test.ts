/**
 * The simulator end to end (issue 41): the whole fleet in this process on seeds fixed here, every
 * invariant checked, and each seed's trace the same on every run.
 */
import { describe, expect, it } from 'vitest';
import { answers, watchControl } from './checks.ts';
import { FAULT_KINDS } from './faults.ts';
import { Fleet } from './fleet.ts';
import type { Violation } from './invariants.ts';
import { runSeed } from './run.ts';
import { parseSearch, SimUsageError } from './search.ts';
import type { SimTenant } from './workload.ts';

describe('a simulated fleet', () => {
  it('serves every seed of a fixed set with every invariant holding', async () => {
    for (const seed of [1, 2, 3, 4]) {
      const r = await runSeed({ seed, rooms: 120 });
      expect(r.violations, `seed ${seed}`).toEqual([]);
      // Answered, left by their clients, or held to their tenant's own limits (each seed draws
      // its tenants: seed 1 has one of 4 rooms at once and 4,000 tokens a minute).
      expect(r.completed + r.ended + r.limited, `seed ${seed}`).toBe(120);
      expect(r.failed, `seed ${seed}`).toBe(0);
      // Every room left a trail: created, the work, its end, two releases.
      expect(r.events).toBeGreaterThan(120 * 8);
    }
  });

  it('holds requests a small KV pool cannot take now in flow control’s queue: each is served in its turn, none refused, none past its time-to-live', async () => {
    // 64 pages an engine, 500 requests a second of up to 300 tokens: most find no pages free.
    const r = await runSeed({
      seed: 3,
      rooms: 300,
      workload: { perSecond: 500, maxTokens: [100, 300] },
      fleet: { pages: 64 },
      keepTrace: true,
    });
    expect(r.violations).toEqual([]);
    expect(r.failed).toBe(0);
    expect(r.completed + r.ended).toBe(300);
    const waits = (r.trace ?? []).flatMap((e) =>
      e.type === 'room.created' && e.data.waitedMs !== undefined ? [e.data.waitedMs] : [],
    );
    expect(waits.length).toBeGreaterThan(150);
    expect(Math.max(...waits)).toBeGreaterThan(100);
  });

  it('holds tenants to their limits, interactive before batch and fair shares, through a flood by one tenant', async () => {
    const tenants: SimTenant[] = [
      { name: 'chat', band: 'interactive', maxConcurrency: null, tokensPerMinute: null },
      { name: 'etl', band: 'batch', maxConcurrency: 2, tokensPerMinute: null },
      { name: 'nightly', band: 'batch', maxConcurrency: null, tokensPerMinute: 3000 },
    ];
    const r = await runSeed({
      seed: 1,
      rooms: 300,
      faults: ['flood'],
      workload: { tenants },
      keepTrace: true,
    });
    expect(r.violations).toEqual([]);
    expect(r.failed).toBe(0);
    expect(r.tenants.map((t) => t.name)).toEqual(['chat', 'etl', 'nightly', 'flood']);
    const rooms = (r.trace ?? []).flatMap((e) => (e.type === 'room.created' ? [e.data] : []));
    // The flood was served beside the others, and the limited tenants' requests waited their turn.
    expect(rooms.filter((d) => d.tenant === 'flood').length).toBeGreaterThan(1000);
    expect(rooms.filter((d) => d.tenant === 'etl' && (d.waitedMs ?? 0) > 0).length).toBeGreaterThan(
      0,
    );
    expect(
      rooms.filter((d) => d.tenant === 'nightly' && (d.waitedMs ?? 0) > 0).length,
    ).toBeGreaterThan(0);
  });

  it('runs a seed the same way twice, and another seed another way', async () => {
    const [a, b, c] = await Promise.all([
      runSeed({ seed: 42, rooms: 60 }),
      runSeed({ seed: 42, rooms: 60 }),
      runSeed({ seed: 43, rooms: 60 }),
    ]);
    expect(a.traceHash).toBe(b.traceHash);
    expect(a.events).toBe(b.events);
    expect(c.traceHash).not.toBe(a.traceHash);
  });

  it('names an answer that is not the model’s, or not a prefix of it for a client that left', () => {
    const request = {
      id: 'sim-000001',
      at: 0,
      prompt: 'alpha beta',
      prefix: null,
      maxTokens: 3,
      stream: true,
      action: null,
      tenant: null,
    };
    const wrong = answers([
      { request, text: ' nothing like it', error: null, finishReason: 'length' },
    ]);
    expect(wrong).toEqual([expect.objectContaining({ invariant: 'answer_is_the_models' })]);
    const left = answers([
      {
        request: { ...request, action: { kind: 'disconnect' as const, afterMs: 5 } },
        text: ' nothing like it',
        error: 'aborted',
        finishReason: null,
      },
    ]);
    expect(left).toEqual([
      expect.objectContaining({ invariant: 'answer_is_a_prefix_of_the_models' }),
    ]);
    const early = answers([
      { request, text: '', error: 'x', finishReason: null, early: 'r-1 transferring' },
    ]);
    expect(early.map((v) => v.invariant)).toContain('streamed_only_committed');
  });
});

describe('the room book check', () => {
  it('names a room the control plane shows otherwise than the journal folds it', async () => {
    const fleet = await Fleet.start({ seed: 9 });
    const found: Violation[] = [];
    watchControl(fleet, found);
    const stream = fleet.control.submit({ prompt: 'alpha beta gamma', maxTokens: 30 });
    await fleet.clock.runUntil(stream.admitted);
    expect(found).toEqual([]);
    // What a defect in the book would look like: its view of a live room off the journal's. The
    // room's next commit shows it.
    const shown = fleet.control.room(stream.room);
    expect(shown?.state).toBe('created');
    if (shown) shown.prefillEngine = 'prefill-9';
    await fleet.clock.runUntil(stream.result.catch(() => null));
    expect(found.length).toBeGreaterThan(0);
    for (const v of found)
      expect(v).toMatchObject({ invariant: 'book_equals_journal', room: stream.room });
    expect(found[0]?.detail).toContain('"prefillEngine":"prefill-9"');
    await fleet.stop();
  });
});

/**
 * The fleet as it was when the seeds below were found: the background canary and the outlier
 * detector joined it later, and with them the same seed runs another schedule.
 */
const BEFORE_CANARY = { canaryEveryMs: 0, outliers: false } as const;
/** The faults of `--faults all` before `retire` joined them (a seed draws its faults from these). */
const BEFORE_RETIRE = FAULT_KINDS.slice(0, FAULT_KINDS.indexOf('retire'));
/** `--faults all` before the lying engine was a fault: the seeds found then replay on these. */
const BEFORE_LIE = FAULT_KINDS.slice(0, FAULT_KINDS.indexOf('lie'));
const THROUGH_LIE = FAULT_KINDS.slice(0, FAULT_KINDS.indexOf('lie') + 1);

describe('a simulated fleet under seeded faults', () => {
  it('keeps every invariant through partitions, kills, freezes, a full disk and bad transfers', async () => {
    // Seed 1 is a full disk: before the journal was probed during an outage (journal-outage.ts),
    // nothing appended after it and every request after the outage was refused. The journal
    // commits in 1 ms, and the faults are drawn from the kinds there were, as when it was found.
    const kinds = FAULT_KINDS.slice(0, FAULT_KINDS.indexOf('control-freeze'));
    for (const seed of [1, 4, 6, 8]) {
      const r = await runSeed({
        seed,
        rooms: 200,
        faults: kinds,
        fleet: { ...BEFORE_CANARY, commitMs: 1 },
      });
      expect(r.faults.length, `seed ${seed}`).toBeGreaterThan(0);
      expect(r.violations, `seed ${seed}`).toEqual([]);
    }
  });

  it('blames no engine for what a stopped control plane or a full disk held up, and loses no release', async () => {
    // Each seed broke an invariant until a fix, under --faults all:
    // 23, 31: the ladder declared engines stalled the moment the journal took writes again, their
    //   rooms having waited on it (`untouched_engine_spared`; journal-outage.ts `refusedAt`);
    // 167: the control plane stopped before the ladder's first tick fenced every engine for the
    //   heartbeats it had not heard (ladder.ts `start`), and then an engine that reconnected having
    //   applied no event was sent none of the rooms that ended meanwhile (`every_room_released`;
    //   engine-link.ts `joinedSeq`);
    // 8: a lost engine's release the full journal refused was never tried again.
    // The faults drawn from the kinds there were then (--faults all, before `relapse`).
    const kinds = FAULT_KINDS.slice(0, FAULT_KINDS.indexOf('relapse'));
    for (const seed of [8, 23, 31, 167]) {
      const r = await runSeed({ seed, rooms: 200, faults: kinds, fleet: BEFORE_CANARY });
      expect(r.violations, `seed ${seed}`).toEqual([]);
    }
  });
});

describe('a simulated fleet with an engine that hangs again after each restart', () => {
  it('cordons that engine and restarts no other', async () => {
    // With 6d2c6f2 undone (the top rung restarting every engine), seed 1 restarts the three
    // healthy engines (`untouched_engine_spared`).
    const r = await runSeed({
      seed: 1,
      rooms: 200,
      faults: ['relapse'],
      fleet: BEFORE_CANARY,
      keepTrace: true,
    });
    expect(r.violations).toEqual([]);
    expect(r.faults).toEqual([expect.objectContaining({ kind: 'relapse', target: 'prefill-1' })]);
    expect(r.failed).toBe(0);
    // Reset in place (asked, then failed), restarted (asked; its recovery is left out here), hung
    // again: cordoned at once, one rung above, the ladder's record committed before the cordon —
    // and taken back by the operator at the end.
    const ladder = (r.trace ?? []).filter(
      (e) =>
        e.engine === 'prefill-1' &&
        (e.type === 'engine.cordoned' ||
          e.type === 'engine.uncordoned' ||
          (e.type === 'recovery.action' && e.data.outcome !== 'recovered')),
    );
    expect(ladder.map((e) => (e.type === 'recovery.action' ? e.data.action : e.type))).toEqual([
      'reset_in_place',
      'reset_in_place',
      'restart_engine',
      'cordon_engine',
      'engine.cordoned',
      'engine.uncordoned',
    ]);
  });
});

describe('a simulated fleet whose control plane is killed and started again', () => {
  it('spares its engines, and loses no release and no page', async () => {
    // 13: a release on its way when the control plane died was sent again to the new one, which
    //   refused it (`not_owner`: it loaded only rooms in flight) and reserved the room's decode
    //   pages for the next rooms (`every_room_released`, `decode_page_reserved_once`; orphans.ts);
    // 17: down for 6 s, it got six hellos from each engine at once, throttled them, and its
    //   ladder reset every engine in place (`untouched_engine_spared`; bus/client.ts).
    for (const seed of [13, 17]) {
      const r = await runSeed({ seed, rooms: 200, faults: ['control-kill'], fleet: BEFORE_CANARY });
      expect(r.faults.length, `seed ${seed}`).toBeGreaterThan(0);
      expect(r.violations, `seed ${seed}`).toEqual([]);
    }
  });
});

describe('a simulated fleet under every fault there is', () => {
  it('settles what a control plane that died left behind', async () => {
    // Under --faults all (the kinds up to control-kill):
    // 41: an engine killed while no control plane ran came back as a new process; the new control
    //   plane never declared the old one lost, so its room was never released for it, and the
    //   surviving decode engine held its pages for good (`every_room_released`; rejoin.ts);
    // 167: a control plane started on a full disk with rooms left in flight threw at start
    //   (`control_plane_starts`; orphans.ts `failOrphans`);
    // 5101: an engine cut off from the start reconnected to a new control plane having applied no
    //   event, and was replayed only its live rooms: those created and failed meanwhile were never
    //   released (`every_room_released`; rejoin.ts `registeredBefore`).
    const kinds = FAULT_KINDS.slice(0, FAULT_KINDS.indexOf('control-kill') + 1);
    // 7137: two engines the faults hit stalled within a minute, and the ladder restarted the stack,
    //   as its rule says — but a full journal had refused one's `engine.stalled`, and the check
    //   took the other engines' restarts for a defect: the rung now names them (`stalled`).
    for (const seed of [41, 167, 5101, 7137]) {
      const r = await runSeed({ seed, rooms: 200, faults: kinds, fleet: BEFORE_CANARY });
      expect(r.violations, `seed ${seed}`).toEqual([]);
    }
  });
});

describe('a simulated fleet whose engines are killed', () => {
  it('answers every client whose room was completing as its engine died', async () => {
    // Seeds 13 and 40: an engine was killed in the millisecond its room's room.completed was
    // committing; the migration lost the race to that end and failed the client's stream, though
    // its room had completed (migration.ts now ends the stream as the room did).
    for (const seed of [13, 40]) {
      // With the journal committing in 1 ms, as when they were found.
      const r = await runSeed({
        seed,
        rooms: 200,
        faults: ['kill'],
        fleet: { ...BEFORE_CANARY, commitMs: 1 },
      });
      expect(r.violations, `seed ${seed}`).toEqual([]);
      expect(r.failed, `seed ${seed}`).toBe(0);
    }
  });
});

describe('a simulated fleet whose engines are retired', () => {
  it('moves a retiring engine’s rooms not begun, and fails no client', async () => {
    // Seed 7 at 400 requests a second: decode-0 and then prefill-0 retired under a queue.
    const r = await runSeed({
      seed: 7,
      rooms: 200,
      faults: ['retire'],
      workload: { perSecond: 400 },
      keepTrace: true,
    });
    expect(r.faults.map((f) => `${f.kind} ${f.target}`)).toEqual([
      'retire decode-0',
      'retire prefill-0',
    ]);
    const moved = (r.trace ?? []).filter(
      (e) => e.type === 'room.migrated' && e.data.reason === 'engine_retiring',
    );
    expect(moved.length).toBeGreaterThan(0);
    expect(r.violations).toEqual([]);
    expect(r.failed).toBe(0);
  });
});

describe('npm run sim', () => {
  it('expands its flags, and refuses bad ones saying what is wrong', () => {
    expect(
      parseSearch(['--seed', '7', '--seeds', '3', '--minutes', '2', '--rate', '10'], () => 1),
    ).toEqual({
      seed: 7,
      seeds: 3,
      rooms: 1200,
      rate: 10,
      out: 'sim-traces',
      faults: [],
      standby: false,
      plan: 'whole',
      journal: 'memory',
    });
    expect(parseSearch(['--standby'], () => 1)).toMatchObject({ standby: true });
    // --journal sqlite: `all` adds the archive's faults, which the in-memory journal refuses.
    const storage: string[] = ['archive-full', 'archive-eio'];
    expect(parseSearch(['--journal', 'sqlite', '--faults', 'all'], () => 1)).toMatchObject({
      journal: 'sqlite',
      faults: FAULT_KINDS,
    });
    expect(() => parseSearch(['--faults', 'archive-full'], () => 1)).toThrow(
      /archive-full is a fault of the archive.*add --journal sqlite/,
    );
    expect(() => parseSearch(['--journal', 'postgres'], () => 1)).toThrow(
      /--journal must be memory or sqlite, got "postgres"/,
    );
    expect(() => parseSearch(['--journal', 'sqlite', '--standby'], () => 1)).toThrow(
      /--standby needs the in-memory journal/,
    );
    expect(parseSearch(['--faults', 'kill,partition'], () => 1)).toMatchObject({
      faults: ['kill', 'partition'],
    });
    expect(parseSearch(['--faults', 'all'], () => 1)).toMatchObject({
      faults: FAULT_KINDS.filter((k) => !storage.includes(k)),
    });
    // Without --rooms, a whole plan draws each seed's length.
    expect(parseSearch([], () => 99)).toMatchObject({ seed: 99, seeds: 1, rooms: null });
    expect(parseSearch(['--plan', 'early'], () => 1)).toMatchObject({ plan: 'early' });
    expect(() => parseSearch(['--plan', 'late'], () => 1)).toThrow(
      /--plan must be early or whole, got "late"/,
    );
    expect(() => parseSearch(['--seeds', '0'], () => 1)).toThrow(
      /--seeds must be a whole number ≥ 1/,
    );
    expect(() => parseSearch(['--rooms', '5', '--minutes', '1'], () => 1)).toThrow(/not both/);
    expect(() => parseSearch(['--bogus'], () => 1)).toThrow(SimUsageError);
    expect(() => parseSearch(['--faults', 'meteor'], () => 1)).toThrow(
      /unknown fault "meteor"; the faults are partition, kill/,
    );
  });
});

describe('a simulated fleet with a standby control plane, as on PostgreSQL', () => {
  it('takes over from a killed leader and from a frozen one, which wakes deposed, and keeps every invariant', async () => {
    for (const seed of [5, 10]) {
      const r = await runSeed({
        seed,
        rooms: 200,
        faults: ['control-kill', 'control-freeze'],
        fleet: { standby: true },
      });
      expect(r.violations, `seed ${seed}`).toEqual([]);
      // The first leader, then the standby after the killed one, then the one that came back to
      // stand by after the frozen one.
      expect(
        r.leaders.map((t) => t.how),
        `seed ${seed}`,
      ).toEqual(['vacant', 'holder_gone', 'lease_expired']);
      expect(new Set(r.leaders.map((t) => t.holder))).toEqual(new Set(['control-a', 'control-b']));
      // The frozen one woke, found the journal led by a newer term, and exited.
      expect(r.deposed, `seed ${seed}`).toHaveLength(1);
    }
  });
});

describe('a simulated fleet with its canary and outlier detector', () => {
  it('ejects no engine a fault did not touch for the faults of the pairs it was in', async () => {
    // Each seed ejected a healthy decode engine until a fault of a pair counted against an engine
    // only where the other served its other rooms well meanwhile (recovery/outliers.ts): two
    // prefill engines corrupting, one decode engine meeting them more often than its peer (44,
    // 146, 254 of --faults all), or the one pair left serving (80); and, where it counted rooms
    // that completed after the span, a stalled prefill engine's rooms that completed once it was
    // reset in place (400, 53 of --faults all, before `retire`); and, where the other engine's
    // last rooms were all after its fault healed, its failures before forgotten (2065296712 of
    // --faults all, found by a long search).
    const runs = [
      ...[44, 146, 254, 400, 53].map((seed) => ({ seed, faults: BEFORE_RETIRE })),
      { seed: 80, faults: ['transfer-corrupt', 'partition', 'freeze'] as const },
      { seed: 2065296712, faults: BEFORE_LIE },
    ];
    for (const { seed, faults } of runs) {
      const r = await runSeed({ seed, rooms: 200, faults: [...faults] });
      expect(
        r.faults.some((f) => f.kind === 'transfer-corrupt' || f.kind === 'transfer-stall'),
        `seed ${seed}`,
      ).toBe(true);
      expect(r.violations, `seed ${seed}`).toEqual([]);
    }
  });

  it('declares no engine stalled for canaries that failed by a fault of the pair', async () => {
    // Seed 189 (--faults all, before `retire`): both prefill engines corrupting, three canaries in a row failed
    // kv_checksum_mismatch in `transferred` — decode's stage — and a healthy decode engine was
    // declared stalled, until a canary's failure counted against the engine its reason blames
    // (control/evidence/engine-health.ts `recordCanary`).
    const r = await runSeed({ seed: 189, rooms: 200, faults: [...BEFORE_RETIRE] });
    expect(r.violations).toEqual([]);
  });
});

describe('a simulated fleet whose engines lie within the protocol', () => {
  it('lets no decode engine’s tokens for another engine’s room reach that room’s client', async () => {
    // Seed 20 of `--faults lie-protocol`: decode-0 streams its tokens under the rooms of decode-1
    // (a shape a decode engine cannot tell is `foreign`, lying-wire.ts). With the relay taking
    // tokens from an engine that does not own the room planted, a client of decode-1 got
    // decode-0's words (answer_is_a_prefix_of_the_models); 7 of seeds 1–200 broke it.
    const r = await runSeed({ seed: 20, rooms: 200, faults: ['lie-protocol'], plan: 'whole' });
    expect(r.faults.map((f) => f.target)).toEqual(['decode-0']);
    expect(r.violations).toEqual([]);
  });
});

describe('a simulated fleet whose faults land late, and on a whole role at once', () => {
  it('plans faults after the workload and across a role, and still holds every invariant', async () => {
    // Seed 8 of relapse,control-kill (plan whole): a control plane killed at 30.9 s, after the
    // ladder's escalations of two relapsing decode engines; with cordons not restored at start
    // planted, it broke restored_state_equals_journal (an early plan found that in none of 100).
    const late = await runSeed({ seed: 8, faults: ['relapse', 'control-kill'], plan: 'whole' });
    expect(late.faults.some((f) => f.kind === 'control-kill' && f.at > 20_000)).toBe(true);
    expect(late.violations).toEqual([]);
    // Seed 35 of every kind through `lie` (plan whole): both decode engines lie, then both are
    // cut off; with the outlier guard dropped planted, both were ejected at once
    // (role_kept_in_rotation).
    const role = await runSeed({ seed: 35, faults: [...THROUGH_LIE], plan: 'whole' });
    const decode = role.faults.filter((f) => f.kind === 'lie').map((f) => f.target);
    expect(decode).toEqual(expect.arrayContaining(['decode-0', 'decode-1']));
    expect(role.violations).toEqual([]);
  });

  it('restarts nothing the journal cannot record, and a prefill engine frozen whole stalls no decode engine', async () => {
    // Seeds 243 and 815 (every kind through `lie`, plan whole, 200 rooms): both engines of a
    // role relapsed while the disk was full; the ladder restarted the whole stack with no record
    // of why, and the healthy role came back as new incarnations the journal could not explain
    // (untouched_engine_spared), until a rung above the in-place reset waited for its record.
    // Seed 4735: both prefill engines frozen before their transfers committed; the decode engines
    // holding those rooms' first tokens said their work loop had work, and were declared stalled,
    // until a room held on the commit stopped counting as decode's work (engine/decode.ts).
    for (const seed of [243, 815, 4735]) {
      const r = await runSeed({ seed, rooms: 200, faults: [...THROUGH_LIE], plan: 'whole' });
      expect(r.violations, `seed ${seed}`).toEqual([]);
    }
  });

  it('fails the rooms a restart on a full disk found in flight once the disk takes writes, not at their deadlines', async () => {
    // Seed 1429 of every kind through `lie-protocol` (plan whole, 200 rooms): a control plane
    // killed while the disk was full came back on it and could not fail the room left decoding;
    // it waited for its 600 s deadline, long after the run (every_room_ends), until the orphans a
    // start could not fail were failed once writes returned (control/rooms/journal-outage.ts).
    const r = await runSeed({
      seed: 1429,
      rooms: 200,
      faults: [...THROUGH_LIE, 'lie-protocol'],
      plan: 'whole',
      keepTrace: true,
    });
    expect(r.violations).toEqual([]);
    const orphaned = (r.trace ?? []).filter(
      (e) => e.type === 'room.failed' && e.data.reason === 'orphaned_by_restart',
    );
    expect(orphaned.length).toBeGreaterThan(0);
  });

  it('runs the SQLite journal as production does — packing, retention into an archive — and every committed room reads back', async () => {
    // Seed 3 of --journal sqlite --faults all: a prefill engine frozen through a canary room's
    // abort reconnected after retention had pruned the room, unreleased; it never released it
    // (every_room_released, pruned_room_was_done) until retention took only rooms released by
    // both their engines (journal/queries.ts RELEASED_BY_BOTH).
    const r = await runSeed({
      seed: 3,
      rooms: 200,
      // `all` of the SQLite journal when it was found (before `lie-protocol`).
      faults: [...THROUGH_LIE, 'archive-full', 'archive-eio'],
      plan: 'whole',
      fleet: { journal: 'sqlite' },
      keepTrace: true,
    });
    expect(r.violations).toEqual([]);
    // Retention pruned rooms into the archive while it served, and they read back from there.
    const pruned = (r.trace ?? []).filter((e) => e.type === 'journal.pruned');
    expect(pruned.reduce((n, e) => n + Number(e.data.rooms), 0)).toBeGreaterThan(50);
    expect(pruned.every((e) => e.data.archived === true)).toBe(true);
  });

  it("keeps an engine's events in order when a full disk refuses one commit and takes the next", async () => {
    // Seeds 1660 and 1834 of --journal sqlite --faults all (200 rooms): SQLite's disk fills per
    // page, so a prefill engine's transfer_posted committed — refused, from `created` — right
    // after its prefill_started had failed; the room stayed in prefilling, and the stall check
    // blamed the engine (untouched_engine_spared) until a failed append broke its session, so
    // that everything after it is resent in order (control/engines/appends.ts `breakAt`).
    for (const seed of [1660, 1834]) {
      const r = await runSeed({
        seed,
        rooms: 200,
        faults: [...THROUGH_LIE, 'archive-full', 'archive-eio', 'lie-protocol'],
        plan: 'whole',
        fleet: { journal: 'sqlite' },
      });
      expect(
        r.faults.map((f) => f.kind),
        `seed ${seed}`,
      ).toContain('disk-full');
      expect(r.violations, `seed ${seed}`).toEqual([]);
    }
  });
});
