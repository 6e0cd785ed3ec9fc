/**
 * The in-memory journal: the contract every backend keeps (test/helpers/journal-contract.ts),
 * then what only it has — commit latency on a virtual clock, refused writes, a crash that loses
 * what had not committed.
 */
import { describe, expect, it } from 'vitest';
import { created, lifecycle } from '../../../test/helpers/events.ts';
import { journalContract } from '../../../test/helpers/journal-contract.ts';
import { MemoryDisk } from '../../journal/memory/disk.ts';
import { VirtualClock } from './clock.ts';
import { MemoryJournal } from './journal.ts';

const disks = new Map<string, MemoryDisk>();
let n = 0;
const place = async () => {
  const name = `memory-${n++}`;
  disks.set(name, new MemoryDisk(name));
  return name;
};

journalContract({
  name: 'in-memory',
  fresh: async () => MemoryJournal.open({ disk: new MemoryDisk(`memory-${n++}`) }),
  place,
  open: async (name) => MemoryJournal.open({ disk: disks.get(name) as MemoryDisk }),
  countCommitted: async (j, seq) =>
    (j as unknown as { disk: MemoryDisk }).disk.events.filter((e) => e.seq <= seq).length,
});

describe('in-memory journal faults', () => {
  it('commits after its latency on the clock, a turn’s appends in one transaction', async () => {
    const clock = new VirtualClock();
    const disk = new MemoryDisk('latency');
    const j = MemoryJournal.open({ disk, clock, commitMs: 5 });
    const acks = Promise.all(['a', 'b', 'c'].map((r) => j.append(created(r))));
    await new Promise((r) => setImmediate(r));
    expect(disk.events).toHaveLength(0);
    expect(j.health().pending).toBe(3);
    clock.advance(4);
    expect(disk.events).toHaveLength(0);
    clock.advance(1);
    expect((await acks).map((a) => a.status)).toEqual(['applied', 'applied', 'applied']);
    expect(disk.events.map((e) => e.room)).toEqual(['a', 'b', 'c']);
    expect(j.health()).toMatchObject({ commits: 1, lastBatchSize: 3, committedSeq: 3 });
    await j.drain();
  });

  it('draws each transaction’s latency when given a function (a disk whose fsync varies)', async () => {
    const clock = new VirtualClock();
    const disk = new MemoryDisk('jitter');
    const latencies = [3, 1];
    const j = MemoryJournal.open({ disk, clock, commitMs: () => latencies.shift() ?? 1 });
    const first = j.append(created('a'));
    await clock.run(2);
    expect(disk.events).toHaveLength(0);
    await clock.run(1);
    expect((await first).status).toBe('applied');
    const second = j.append(created('b'));
    await clock.run(1);
    expect((await second).status).toBe('applied');
    expect(disk.events.map((e) => e.room)).toEqual(['a', 'b']);
    await j.drain();
  });

  it('refuses writes whole while told to, then takes them again', async () => {
    const disk = new MemoryDisk('full');
    const j = MemoryJournal.open({ disk });
    await j.append(created('first'));
    j.refuseWrites('no space left on the simulated disk');
    await expect(j.append(created('refused'))).rejects.toMatchObject({
      code: 'JOURNAL_WRITE_FAILED',
      message: expect.stringContaining('no space left'),
    });
    expect(j.health().writable).toBe(false);
    expect(disk.events).toHaveLength(1);
    j.refuseWrites(null);
    expect((await j.append(created('again'))).status).toBe('applied');
    expect(j.health().writable).toBe(true);
    await j.drain();
  });

  it('a crash loses what had not committed, keeps what had, and frees the writer', async () => {
    const clock = new VirtualClock();
    const disk = new MemoryDisk('crash');
    const j = MemoryJournal.open({ disk, clock, commitMs: 10 });
    const kept = j.append(created('kept'));
    await clock.run(10);
    expect((await kept).status).toBe('applied');
    const lost = j.append(created('lost'));
    // Handed to the disk (the flush is due now), not yet committed (that takes 10 ms).
    await clock.run(0);
    j.crash();
    await expect(lost).rejects.toMatchObject({ code: 'JOURNAL_CLOSED' });
    clock.advance(100);
    expect(disk.events.map((e) => e.room)).toEqual(['kept']);
    const again = MemoryJournal.open({ disk, clock });
    expect(await again.headSeq()).toBe(1);
    for (const ev of lifecycle('after', 'prefill-0', 'decode-0').slice(0, 2)) {
      const appended = again.append(ev);
      await clock.run(0);
      expect((await appended).status).toBe('applied');
    }
    expect((await again.verify()).ok).toBe(true);
    await again.drain();
  });
});

describe('in-memory journal leadership, as on PostgreSQL', () => {
  const lead = (holder: string) => ({ holder, leaseMs: 300 });
  /** An append, handed to the disk on the journal's (virtual) clock. */
  const append = (j: MemoryJournal, clock: VirtualClock, room: string) => {
    const done = j.append(created(room));
    void clock.run(0);
    return done;
  };

  it('a standby waits while the leader renews, takes term 2 the moment it crashes, and the journal says who led', async () => {
    const clock = new VirtualClock();
    const disk = new MemoryDisk('crashed-leader');
    const a = MemoryJournal.open({ disk, clock, lead: lead('a') });
    expect(a.leadership).toEqual({ term: 1, holder: 'a', how: 'vacant', previous: null });
    await append(a, clock, 'by-a');
    const waiting: string[] = [];
    const standby = MemoryJournal.standBy(
      { disk, clock, lead: lead('b') },
      { onWaiting: (why) => waiting.push(why) },
    );
    // The leader renews its lease every 100 ms: the standby waits however long it runs.
    await clock.run(2000);
    expect(waiting).toEqual([
      expect.stringMatching(/^journal crashed-leader is led by a \(term 1, lease \d+ ms left\)/),
    ]);
    a.crash();
    await clock.run(75);
    const b = await standby;
    expect(b.leadership).toEqual({ term: 2, holder: 'b', how: 'holder_gone', previous: 'a' });
    expect(b.health().term).toBe(2);
    await append(b, clock, 'by-b');
    expect((await b.stats()).leaders).toEqual([
      expect.objectContaining({ term: 1, holder: 'a', how: 'vacant', events: 1 }),
      expect.objectContaining({
        term: 2,
        holder: 'b',
        how: 'holder_gone',
        previous: 'a',
        events: 1,
      }),
    ]);
    await b.drain();
  });

  it('takes over from a frozen leader once its lease runs out, and refuses every commit of the old term however late it wakes', async () => {
    // The leader's own clock stands still while it is frozen: its timers (the renewal) do not run.
    const frozen = new VirtualClock();
    const clock = new VirtualClock();
    const disk = new MemoryDisk('frozen-leader');
    const a = MemoryJournal.open({ disk, clock: frozen, commitMs: 5, lead: lead('a') });
    const deposed: string[] = [];
    a.onDeposed((why) => deposed.push(why));
    const late = a.append(created('late')).catch((err: unknown) => err);
    // Handed to the disk, committing (5 ms) when the leader is frozen.
    await frozen.run(0);
    // Within the lease, nobody else leads.
    clock.advance(250);
    expect(() => MemoryJournal.open({ disk, clock, lead: lead('b') })).toThrow(/led by a/);
    clock.advance(100);
    const b = MemoryJournal.open({ disk, clock, lead: lead('b') });
    expect(b.leadership).toMatchObject({ term: 2, how: 'lease_expired', previous: 'a' });
    await append(b, clock, 'by-b');
    // a wakes: its commit in flight, and anything after, is refused; it hears it was deposed.
    await frozen.run(400);
    expect(await late).toMatchObject({ code: 'JOURNAL_FENCED' });
    await expect(append(a, frozen, 'later')).rejects.toMatchObject({
      code: 'JOURNAL_FENCED',
      message: expect.stringContaining('no longer leads frozen-leader (term 1'),
    });
    expect(deposed).toEqual(['a newer term took the journal']);
    expect(disk.events.map((e) => e.room)).toEqual(['by-b']);
    a.close();
    // A deposed journal closing does not resign the new leader's term.
    expect(disk.leadership.row).toMatchObject({ term: 2, holder: 'b' });
    expect(disk.leadership.row.leaseUntil).toBeGreaterThan(0);
    await b.drain();
  });

  it('a leader that closes cleanly hands over at once', async () => {
    const clock = new VirtualClock();
    const disk = new MemoryDisk('resigned');
    await MemoryJournal.open({ disk, clock, lead: lead('a') }).drain();
    const b = MemoryJournal.open({ disk, clock, lead: lead('b') });
    expect(b.leadership).toMatchObject({ term: 2, how: 'resigned', previous: 'a' });
    // A journal without a term cannot take a disk another one leads.
    expect(() => MemoryJournal.open({ disk, clock })).toThrow(/has a writer already/);
    await b.drain();
  });
});
