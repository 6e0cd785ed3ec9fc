/**
 * The drills whose fault the simulator draws, kept as seeds (issue 68). `pdctl drill` stays the
 * way an operator proves a fix on a real stack, and test/drill.e2e.test.ts keeps the command's
 * own tests; what each drill below measured is read here from a seed's journal, in virtual time,
 * so its timing targets are held exactly rather than reported. Every seed also holds every
 * invariant of docs/simulation.md, which are the drills' common checks: every room terminal
 * within its deadlines, every reservation claimed, every answer the model's, nothing answered
 * missing from the journal, no page leaked.
 *
 * Each seed was found by drawing from the one fault kind until its schedule did what the drill
 * does; the first assertions say that it still does, so that a change to the fleet that moves the
 * schedule fails here instead of passing on a seed that no longer drills anything.
 */
import { describe, expect, it } from 'vitest';
import type { JournalEvent, JournalEventOf } from '../room/events.ts';
import { runSeed, type SeedOptions, type SeedReport } from './run.ts';

/** The drills' own targets (src/drills/scenarios.ts, abort-cascade.ts). */
const DETECT_TRANSFER_STALL_MS = 1500;
const RECOVER_IN_PLACE_MS = 1000;
const ALL_TERMINAL_MS = 2000;

async function seed(
  options: SeedOptions,
): Promise<SeedReport & { trace: readonly JournalEvent[] }> {
  // The drills' seeds were kept on an open API: no tenants drawn (their limits would move the timing).
  const r = await runSeed({
    rooms: 200,
    ...options,
    workload: { tenants: [], ...options.workload },
    keepTrace: true,
  });
  expect(r.violations, `seed ${options.seed}`).toEqual([]);
  return r as SeedReport & { trace: readonly JournalEvent[] };
}

function of<T extends JournalEvent['type']>(
  trace: readonly JournalEvent[],
  type: T,
  engine?: string,
): JournalEventOf<T>[] {
  return trace.filter(
    (e): e is JournalEventOf<T> => e.type === type && (engine === undefined || e.engine === engine),
  );
}

/** The incarnations each engine registered, in order. */
function incarnations(trace: readonly JournalEvent[]): Record<string, string[]> {
  const by: Record<string, string[]> = {};
  for (const e of of(trace, 'engine.registered')) {
    const list = by[e.engine as string] ?? [];
    if (list.at(-1) !== e.data.incarnation) list.push(e.data.incarnation);
    by[e.engine as string] = list;
  }
  return by;
}

/** The rooms that ended `completed`. */
function completed(trace: readonly JournalEvent[]): Set<string> {
  return new Set(of(trace, 'room.completed').map((e) => e.room as string));
}

/** What the ladder did to an engine, in order: `reset_in_place`, `restart_engine`, … */
function ladder(trace: readonly JournalEvent[], engine: string): string[] {
  return of(trace, 'recovery.action', engine)
    .map((e) => e.data.action)
    .filter((a, i, all) => a !== all[i - 1]);
}

describe('the drills, as kept seeds', () => {
  it('transfer-stall: detected within 1.5 s, recovered in place within 1 s, no process restarted', async () => {
    const r = await seed({ seed: 1, faults: ['transfer-stall'] });
    expect(r.faults.map((f) => `${f.kind} ${f.target}`)).toEqual(['transfer-stall prefill-0']);
    const [stalled] = of(r.trace, 'engine.stalled', 'prefill-0');
    const [reset] = of(r.trace, 'recovery.action', 'prefill-0');
    const [recovered] = of(r.trace, 'engine.recovered', 'prefill-0');
    expect(stalled?.data.reason).toMatch(/transfer core completed nothing/);
    expect(reset?.data.action).toBe('reset_in_place');
    expect(reset?.data.detectMs).toBeLessThanOrEqual(DETECT_TRANSFER_STALL_MS);
    expect(recovered?.data.rung).toBe('reset_in_place');
    expect((recovered?.ts ?? Infinity) - (stalled?.ts ?? 0)).toBeLessThanOrEqual(
      RECOVER_IN_PLACE_MS,
    );
    // Recovered without restarting any process: one incarnation each, nothing exited.
    expect(of(r.trace, 'engine.exited')).toEqual([]);
    for (const list of Object.values(incarnations(r.trace))) expect(list).toHaveLength(1);
    expect(r.failed).toBe(0);
  });

  it('compute-hang: the reset in place is not enough, so that engine alone is restarted; its rooms go on', async () => {
    const r = await seed({ seed: 13, faults: ['freeze'] });
    expect(r.faults.map((f) => `${f.kind} ${f.target}`)).toEqual(['freeze prefill-0']);
    expect(ladder(r.trace, 'prefill-0')).toEqual(['reset_in_place', 'restart_engine']);
    const by = incarnations(r.trace);
    expect(by['prefill-0']).toHaveLength(2);
    for (const other of ['prefill-1', 'decode-0', 'decode-1']) {
      expect(by[other], other).toHaveLength(1);
      expect(ladder(r.trace, other), other).toEqual([]);
    }
    expect(r.failed).toBe(0);
  });

  for (const [drill, seedNo, engine] of [
    ['kill-prefill', 1, 'prefill-1'],
    ['kill-decode', 20, 'decode-0'],
  ] as const) {
    it(`${drill}: the engine is replaced and serves again, and its rooms move on unbroken`, async () => {
      const r = await seed({ seed: seedNo, faults: ['kill'] });
      expect(r.faults.map((f) => `${f.kind} ${f.target}`)).toEqual([`kill ${engine}`]);
      expect(of(r.trace, 'engine.exited').map((e) => e.engine)).toEqual([engine]);
      const [exited] = of(r.trace, 'engine.exited');
      expect(exited?.data.signal).toBe('SIGKILL');
      // A new incarnation registered, and was given rooms after it did.
      const [, replaced] = of(r.trace, 'engine.registered', engine);
      expect(replaced?.data.incarnation).not.toBe(
        of(r.trace, 'engine.registered', engine)[0]?.data.incarnation,
      );
      const role = engine.startsWith('prefill') ? 'prefillEngine' : 'decodeEngine';
      const after = of(r.trace, 'room.created').filter(
        (e) => e.seq > (replaced?.seq ?? Infinity) && e.data[role] === engine,
      );
      expect(after.length).toBeGreaterThan(0);
      // Every room it held moved to another pair, and that room completed.
      const moved = of(r.trace, 'room.migrated');
      expect(moved.length).toBeGreaterThan(0);
      const done = completed(r.trace);
      for (const m of moved) {
        expect(m.data.detail).toMatch(
          new RegExp(`^${engine} lost: process \\d+ exited \\(SIGKILL\\)`),
        );
        expect(done.has(m.data.toRoom), m.data.toRoom).toBe(true);
      }
      expect(r.failed).toBe(0);
    });
  }

  it('kv-corruption: corrupted KV is caught before decode, and each room so caught is tried again and completes', async () => {
    const r = await seed({ seed: 1, faults: ['transfer-corrupt'] });
    expect(r.faults.map((f) => `${f.kind} ${f.target}`)).toEqual(['transfer-corrupt prefill-0']);
    const caught = of(r.trace, 'room.failed').filter(
      (e) => e.data.reason === 'kv_checksum_mismatch',
    );
    expect(caught.length).toBeGreaterThan(0);
    const retried = new Map(
      of(r.trace, 'recovery.action')
        .filter((e) => e.data.action === 'retry_room')
        .map((e) => [e.room, e.data.toRoom]),
    );
    const done = completed(r.trace);
    for (const f of caught) {
      // Caught at the decode engine's load of the transfer: the room never decoded a token.
      expect(f.data.stage).toBe('transferred');
      const again = retried.get(f.room);
      expect(again, f.room as string).toBeDefined();
      expect(done.has(again as string)).toBe(true);
    }
    expect(r.failed).toBe(0);
  });

  it('bad-engine: the corrupting prefill engine alone is ejected; the rooms it failed are tried again without it, and no engine restarted', async () => {
    const r = await seed({ seed: 499, faults: ['transfer-corrupt'] });
    expect(r.faults.map((f) => `${f.kind} ${f.target}`)).toEqual(['transfer-corrupt prefill-0']);
    expect(of(r.trace, 'engine.ejected').map((e) => e.engine)).toEqual(['prefill-0']);
    // The journal says who was blamed and why: each retry names the engine it left out.
    const retries = of(r.trace, 'recovery.action').filter((e) => e.data.action === 'retry_room');
    expect(retries.length).toBeGreaterThan(0);
    for (const e of retries) {
      expect(e.data.reason).toBe('kv_checksum_mismatch');
      expect(e.data.outcome).toMatch(/without prefill-0/);
    }
    expect(of(r.trace, 'engine.exited')).toEqual([]);
    expect(r.failed).toBe(0);
  });

  it('journal-unwritable: new work is refused while the journal cannot write, and taken again after', async () => {
    const r = await seed({ seed: 1, faults: ['disk-full'] });
    expect(r.faults.map((f) => f.kind)).toEqual(['disk-full']);
    expect(r.failed).toBeGreaterThan(0);
    expect(Object.keys(r.errors).join('\n')).toMatch(/journal/i);
    const [writable] = of(r.trace, 'recovery.action').filter(
      (e) => e.data.action === 'journal_writable',
    );
    expect(writable).toBeDefined();
    // Rooms created after it was writable again, and completed.
    const done = completed(r.trace);
    const later = of(r.trace, 'room.created').filter((e) => e.seq > (writable?.seq ?? Infinity));
    expect(later.filter((e) => done.has(e.room as string)).length).toBeGreaterThan(0);
  });

  it('kill-control-plane: restarted on its journal, its engines reconnect as they were, and the rooms it left are failed orphaned_by_restart', async () => {
    const r = await seed({ seed: 3, faults: ['control-kill'] });
    expect(r.faults.map((f) => f.kind)).toEqual(['control-kill', 'control-kill', 'control-kill']);
    const orphaned = of(r.trace, 'room.failed').filter(
      (e) => e.data.reason === 'orphaned_by_restart',
    );
    expect(orphaned.length).toBeGreaterThan(0);
    expect(
      of(r.trace, 'recovery.action').filter((e) => e.data.action === 'fail_orphaned_rooms'),
    ).toHaveLength(1);
    // Engines survived: each registered again after the restart, as the same process.
    expect(of(r.trace, 'engine.exited')).toEqual([]);
    for (const [engine, list] of Object.entries(incarnations(r.trace)))
      expect(list, engine).toHaveLength(1);
    expect(of(r.trace, 'engine.registered').length).toBeGreaterThan(4);
  });

  it('abort-cascade: every client drops mid-answer; every room ends aborted or completed within 2 s of the last drop, each released once by each engine', async () => {
    const r = await seed({
      seed: 5,
      rooms: 40,
      workload: {
        streamShare: 1,
        abortShare: 0,
        disconnectShare: 1,
        perSecond: 400,
        maxTokens: [200, 400],
        // The built-in model streams 300 tokens in about 15 ms of virtual time: drop within 10.
        actWithinMs: 10,
      },
    });
    const aborted = of(r.trace, 'room.aborted');
    expect(aborted.length).toBeGreaterThanOrEqual(30);
    expect(r.ended).toBe(40 - r.completed);
    const asked = of(r.trace, 'room.abort_requested');
    const lastAsk = Math.max(...asked.map((e) => e.ts));
    // The clients' rooms (the canary's go on): each is one whose client asked for its abort.
    const rooms = new Set(asked.map((e) => e.room));
    expect(rooms.size).toBe(40);
    const ends = [...aborted, ...of(r.trace, 'room.completed')]
      .filter((e) => rooms.has(e.room))
      .map((e) => e.ts);
    expect(ends).toHaveLength(40);
    expect(Math.max(...ends) - lastAsk).toBeLessThanOrEqual(ALL_TERMINAL_MS);
    // Each engine released each aborted room once.
    const releases = of(r.trace, 'room.released');
    for (const a of aborted) {
      const by = releases.filter((e) => e.room === a.room).map((e) => e.engine);
      expect(by, a.room as string).toHaveLength(2);
      expect(new Set(by).size).toBe(2);
    }
  });
});
