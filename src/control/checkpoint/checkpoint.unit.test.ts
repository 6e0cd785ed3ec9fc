/**
 * State checkpoints on the in-memory journal: a start from a checkpoint plus the events after it
 * rebuilds exactly what a fold of the whole journal does, and a checkpoint that cannot be trusted
 * is refused with its reason — the full rebuild runs and a warning says why.
 */
import { describe, expect, it } from 'vitest';
import { lifecycle } from '../../../test/helpers/events.ts';
import { MemoryDisk } from '../../journal/memory/disk.ts';
import type { StoredCheckpoint } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import type { EventInput } from '../../room/events.ts';
import { VirtualClock } from '../../sim/world/clock.ts';
import { MemoryJournal } from '../../sim/world/journal.ts';
import { Checkpointer } from './checkpointer.ts';
import {
  CHECKPOINT_FORMAT,
  CHECKPOINT_NAME,
  decodeCheckpoint,
  digestOf,
  encodeCheckpoint,
} from './codec.ts';
import { restoreState } from './replay.ts';
import { StartState } from './state.ts';
import { checkCheckpoint } from './verify.ts';

const block = (n: number) => n.toString(16).padStart(32, '0');

const registered = (engine: string, incarnation: string, role: 'prefill' | 'decode') =>
  ({
    type: 'engine.registered',
    engine,
    source: 'control',
    data: { role, incarnation },
  }) as EventInput;

/** A completed room whose prefill engine stored blocks `from…from+3` and evicted `evict`. */
function room(id: string, from: number, evict: number[] = []): EventInput[] {
  return lifecycle(id).map((e) => {
    if (e.type === 'room.transfer_posted')
      return {
        ...e,
        data: {
          ...e.data,
          storedBlocks: [0, 1, 2, 3].map((i) => block(from + i)),
          evictedBlocks: evict.map(block),
        },
      };
    return e;
  });
}

const cordoned = (engine: string): EventInput => ({
  type: 'engine.cordoned',
  engine,
  source: 'api',
  data: { reason: 'inspect', by: 'operator', rooms: 0 },
});

function recorder(): Logger & { warnings: string[] } {
  const warnings: string[] = [];
  const none = () => {};
  return { warnings, debug: none, info: none, error: none, warn: (_o, m) => warnings.push(m) };
}

/** What a state holds, comparable. */
function view(s: StartState) {
  return {
    index: s.index.snapshot(),
    cordons: Object.fromEntries(s.cordons),
    pools: Object.fromEntries([...s.pools].map(([e, ev]) => [e, ev.seq])),
    registered: Object.fromEntries(s.registered),
  };
}

async function journalWith(events: EventInput[]) {
  const j = MemoryJournal.open({ disk: new MemoryDisk('checkpoints') });
  for (const e of events) expect((await j.append(e)).status).toBe('applied');
  return j;
}

const first = [
  registered('p0', 'i1', 'prefill'),
  registered('d0', 'j1', 'decode'),
  ...room('r1', 0),
  cordoned('d9'),
];
const after = [
  registered('d0', 'j1', 'decode'), // a hello to a new control plane: the same pool
  ...room('r2', 10, [0, 1]),
  registered('p0', 'i2', 'prefill'), // a new incarnation: its cache is empty again
  ...room('r3', 20),
  { ...cordoned('d9'), type: 'engine.uncordoned', data: { reason: 'fixed', by: 'operator' } },
  cordoned('p0'),
] as EventInput[];

describe('state checkpoints', () => {
  it('a checkpoint plus the events after it rebuild what the whole journal does', async () => {
    const j = await journalWith(first);
    const mid = await j.headSeq();
    const atMid = new StartState();
    await atMid.foldJournal(j, mid);
    await j.setCheckpoint(encodeCheckpoint(atMid, atMid.index));
    for (const e of after) await j.append(e);
    const head = await j.headSeq();

    const whole = new StartState();
    await whole.foldJournal(j, head);
    const log = recorder();
    const restored = await restoreState(j, head, log);
    expect(restored.from?.seq).toBe(mid);
    expect(restored.ignored).toBeNull();
    expect(log.warnings).toEqual([]);
    // Only the tail's events of the state's types were read: its 4 engine events, and the
    // prefill_started and transfer_posted of its 2 rooms.
    expect(restored.folded).toBe(4 + 2 * 2);
    expect(view(restored.state)).toEqual(view(whole));
    // What the fold says: p0's new incarnation holds only r3's blocks; d0's pool began at its first hello.
    expect(restored.state.index.blocksOn('p0')).toBe(4);
    expect(restored.state.pools.get('d0')?.seq).toBe(2);
    expect(restored.state.registered.get('d0')).toEqual({ incarnation: 'j1', seq: mid + 1 });
    expect([...restored.state.cordons.keys()]).toEqual(['p0']);
  });

  it('is written by the checkpointer every so many events, and when asked', async () => {
    const j = await journalWith(first);
    const clock = new VirtualClock();
    const state = new StartState();
    await state.foldJournal(j, await j.headSeq());
    const restored = { state, from: null, ignored: null, folded: 0 };
    const policy = { checkpointEveryEvents: 5, checkpointEveryMs: 60_000 };
    const router = { index: state.index };
    const cp = new Checkpointer({ journal: j, log: recorder(), clock, policy, router }, restored);
    const sub = j.subscribe(await j.headSeq(), (ev) => {
      state.index.fold(ev);
      cp.folded(ev);
    });
    for (const e of after.slice(0, 4)) await j.append(e);
    await new Promise((r) => setImmediate(r));
    clock.advance(1000);
    await j.append(after[4] as EventInput);
    await new Promise((r) => setImmediate(r));
    await cp.write();
    sub.close();
    expect((await j.getCheckpoint(CHECKPOINT_NAME))?.seq).toBe(state.seq);
    expect(cp.seq).toBe(state.seq);
  });

  it('refuses a checkpoint it cannot trust, and the full rebuild runs and says why', async () => {
    const j = await journalWith([...first, ...after]);
    const head = await j.headSeq();
    const whole = new StartState();
    await whole.foldJournal(j, head);
    const good = encodeCheckpoint(whole, whole.index);
    await j.setCheckpoint({ ...good, data: good.data.replace('"p0"', '"p1"') });
    const log = recorder();
    const restored = await restoreState(j, head, log);
    expect(restored.from).toBeNull();
    expect(restored.ignored).toMatch(/does not match its sha256 digest/);
    expect(log.warnings).toEqual([expect.stringMatching(/^state checkpoint ignored: its data/)]);
    expect(view(restored.state)).toEqual(view(whole));
  });

  it('names what is wrong with each kind of untrusted checkpoint', () => {
    const state = new StartState(5);
    state.anchor = { seq: 3, id: 'the-registration-at-3' };
    const row = encodeCheckpoint(state, state.index);
    const stored = (over: Partial<StoredCheckpoint> = {}): StoredCheckpoint => ({
      ...row,
      schemaVersion: 4,
      currentSchemaVersion: 4,
      brokenBy: null,
      writtenAt: 1,
      ...over,
    });
    const A = { seq: 3, id: 'a' };
    const why = (over: Partial<StoredCheckpoint>, head = 10) => {
      const d = decodeCheckpoint(stored(over), head);
      return 'ignored' in d ? d.ignored : 'trusted';
    };
    expect(why({})).toBe('trusted');
    expect(why({ format: CHECKPOINT_FORMAT + 1 })).toMatch(
      new RegExp(`of format ${CHECKPOINT_FORMAT + 1} and this pdctl reads`),
    );
    // Migrations since that read every event as before keep it; one that changed them does not.
    expect(why({ schemaVersion: 3 })).toBe('trusted');
    expect(why({ schemaVersion: 3, brokenBy: '0004_x' })).toMatch(
      /journal migration 0004_x, applied since it was written \(under schema 3\), changed what events read back/,
    );
    expect(why({ schemaVersion: 5 })).toMatch(/schema 5, newer than the journal's 4/);
    expect(why({}, 4)).toMatch(/at seq 5 but the journal ends at seq 4/);
    expect(why({ data: '{', digest: digestOf('{') })).toMatch(/not JSON/);
    const shaped = (data: unknown) =>
      why({ data: JSON.stringify(data), digest: digestOf(JSON.stringify(data)) });
    expect(shaped([])).toMatch(/not an object/);
    expect(
      shaped({
        anchor: A,
        index: { p0: { incarnation: 1, blocks: [] } },
        cordons: {},
        pools: [],
      }),
    ).toMatch(/index entry of p0/);
    expect(shaped({ anchor: A, index: {}, cordons: { d0: { reason: 'x' } }, pools: [] })).toMatch(
      /cordon of d0/,
    );
    expect(shaped({ anchor: 'a', index: {}, cordons: {}, pools: [], registered: {} })).toMatch(
      /`anchor` is not \{ seq, id \} of a registration/,
    );
    // Nothing registered yet: nothing to restore, nothing to bind it by.
    expect(shaped({ anchor: null, index: {}, cordons: {}, pools: [], registered: {} })).toBe(
      'trusted',
    );
    const cordon = { reason: 'x', by: 'operator', evidence: null, at: 1 };
    expect(
      shaped({ anchor: null, index: {}, cordons: { d0: cordon }, pools: [], registered: {} }),
    ).toMatch(/names no registration, so it is bound to no journal/);
    const pool = { type: 'engine.registered', engine: 'd0', seq: 1, data: { role: 'chef' } };
    expect(shaped({ anchor: A, index: {}, cordons: {}, pools: [pool], registered: {} })).toMatch(
      /the pool of d0/,
    );
    expect(
      shaped({ anchor: A, index: {}, cordons: {}, pools: [], registered: { d0: 'x' } }),
    ).toMatch(/the registration of d0/);
  });

  it('journal verify says whether a start would trust it and whether it is the fold through its seq', async () => {
    const j = await journalWith([...first, ...after]);
    expect(await checkCheckpoint(j)).toMatchObject({ verdict: 'none', seq: null });
    // Through the cordon that ends `first`: retention keeps such events, and prunes r1's.
    const at = first.length;
    const through = new StartState();
    await through.foldJournal(j, at);
    const good = encodeCheckpoint(through, through.index);
    await j.setCheckpoint(good);
    expect(await checkCheckpoint(j)).toMatchObject({ verdict: 'equal', seq: at });
    await j.setCheckpoint({ ...good, digest: digestOf('other') });
    expect(await checkCheckpoint(j)).toMatchObject({
      verdict: 'ignored',
      detail: expect.stringMatching(/would ignore it .*sha256/),
    });
    // Whole and trusted, but not what the journal folds to: a defect verify must report.
    through.cordons.set('p0', { reason: 'made up', by: 'operator', evidence: null, at: 1 });
    await j.setCheckpoint(encodeCheckpoint(through, through.index));
    expect(await checkCheckpoint(j)).toMatchObject({ verdict: 'differs', seq: at });
    // After retention deleted the rooms whose blocks it folded, a difference is what is expected.
    await j.setCheckpoint(good);
    await j.prune({ cutoffTs: Date.now() + 60_000 });
    expect(await checkCheckpoint(j)).toMatchObject({ verdict: 'pruned' });
    // Bound to a registration, which retention keeps: still trusted once the events at its own
    // seq are pruned (format 2 bound it to those, and a journal under --retain ignored it).
    const r2 = new StartState();
    await r2.foldJournal(j, first.length + 2);
    // Its anchor: d0's hello to a new control plane, the first event of `after`.
    expect(r2.anchor?.seq).toBe(first.length + 1);
    await j.setCheckpoint(encodeCheckpoint(r2, r2.index));
    expect(await checkCheckpoint(j)).toMatchObject({ verdict: 'equal', seq: first.length + 2 });
    // One whose registration is not in this journal cannot be shown to be this journal's.
    r2.anchor = { seq: 3, id: 'gone' }; // r1's first event, pruned
    await j.setCheckpoint(encodeCheckpoint(r2, r2.index));
    expect(await checkCheckpoint(j)).toMatchObject({
      verdict: 'ignored',
      detail: expect.stringMatching(/holds no event at seq \d+, where its registration gone was/),
    });
  });

  it('a checkpoint from another journal is bound to that one: a start here ignores it, saying so', async () => {
    // Two journals of the same shape and length: the seq fits, the events do not.
    const other = await journalWith([...first, cordoned('x9'), ...after]);
    const head = await other.headSeq();
    const theirs = new StartState();
    await theirs.foldJournal(other, head);
    const j = await journalWith([...first, ...after, cordoned('d7')]);
    expect(await j.headSeq()).toBe(head);
    await j.setCheckpoint(encodeCheckpoint(theirs, theirs.index));
    const log = recorder();
    const restored = await restoreState(j, head, log);
    expect(restored.from).toBeNull();
    expect(restored.ignored).toMatch(
      /taken from another journal: its registration at seq \d+ is \S+, this journal's event there is \S+/,
    );
    const whole = new StartState();
    await whole.foldJournal(j, head);
    expect(view(restored.state)).toEqual(view(whole));
    expect([...restored.state.cordons.keys()].sort()).toEqual(['d7', 'p0']);
    expect(await checkCheckpoint(j)).toMatchObject({ verdict: 'ignored' });
  });
});
