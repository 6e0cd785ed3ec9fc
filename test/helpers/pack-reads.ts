/**
 * What a journal's reads give, each a different path through rows and packs: the packs tests of
 * both backends compare them before and after packing.
 */

import type { JournalLog, JournalReader } from '../../src/journal/store.ts';
import { synthEvents } from '../../src/journal/synth.ts';
import type { EventInput } from '../../src/room/events.ts';

export const END = Date.parse('2026-11-30T00:00:00Z');

/** Rooms over the 20 minutes before END, on two engines of each role, one incident among them. */
export function packTestEvents(rooms: number): EventInput[] {
  return [
    ...synthEvents({
      rooms,
      seed: 11,
      spanMs: 20 * 60_000,
      endTs: END,
      prefill: ['p0', 'p1'],
      decode: ['d0', 'd1'],
      incidents: 1,
    }),
  ];
}

/** What the journal's reads give, each a different path through rows and packs. */
export async function reads(j: JournalReader & Pick<JournalLog, 'engineBacklog'>) {
  const all = await j.readFrom(0, 1_000_000);
  const paged: number[] = [];
  for (let after = 0; ; ) {
    const page = await j.readFrom(after, 37);
    if (page.length === 0) break;
    paged.push(...page.map((e) => e.seq));
    after = page[page.length - 1]?.seq as number;
  }
  const failed = all.find((e) => e.type === 'room.failed')?.room as string;
  const mid = all[Math.floor(all.length / 2)]?.ts as number;
  const stats = await j.stats();
  return {
    all,
    paged,
    newest: await j.tail({ limit: 20 }),
    completedOldest: await j.tail({
      type: 'room.completed',
      order: 'oldest',
      limit: 15,
      afterSeq: 100,
    }),
    endedNewest: await j.tail({ type: ['room.failed', 'room.aborted'], limit: 10 }),
    byEngine: await j.tail({ engine: 'd1', limit: 25 }),
    since: await j.tail({ since: mid, order: 'oldest', limit: 30 }),
    failedSince: await j.tail({ type: 'room.failed', since: mid - 60_000, limit: 500 }),
    nothingSince: await j.tail({ since: END + 3_600_000 }),
    byRoom: await j.tail({ room: failed, limit: 100 }),
    timeline: await j.timeline(failed),
    perMinute: await j.perMinute({ since: mid - 5 * 60_000, until: mid + 5 * 60_000 }),
    stats: {
      events: stats.events,
      firstSeq: stats.firstSeq,
      lastSeq: stats.lastSeq,
      firstTs: stats.firstTs,
      lastTs: stats.lastTs,
      eventsByType: stats.eventsByType,
      rejected: stats.rejectedEvents,
    },
    prunable: await j.countPrunable(mid, mid),
    backlog: await j.engineBacklog('d0', 200),
    head: await j.headSeq(),
  };
}
