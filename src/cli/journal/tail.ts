/** `pdctl journal tail`: the newest events, or the first from --since on; --follow keeps going. */

import { UsageError } from '../../errors.ts';
import { EVENT_TYPES, type EventType, type JournalEvent } from '../../journal/events.ts';
import { SqliteReader } from '../../journal/sqlite/reader.ts';
import type { TailFilter } from '../../journal/store.ts';
import { formatTs, parseTime } from '../../time.ts';
import { type CommonOptions, EXIT, note, print } from '../context.ts';
import { describeEvent } from '../describe.ts';

function eventRow(e: JournalEvent): string {
  return [
    String(e.seq).padStart(8),
    formatTs(e.ts),
    e.type.padEnd(24),
    (e.room ?? '-').padEnd(20),
    (e.engine ?? '-').padEnd(6),
    describeEvent(e),
  ]
    .join('  ')
    .trimEnd();
}

export interface TailOptions extends CommonOptions {
  follow?: boolean;
  type?: string;
  room?: string;
  engine?: string;
  since?: string;
  limit: string;
  intervalMs: string;
}

function parseTypes(input: string): EventType[] {
  const types = input.split(',').map((s) => s.trim());
  const expanded: EventType[] = [];
  for (const t of types) {
    // `room.*` or `engine` select a family.
    const family = t.endsWith('.*')
      ? t.slice(0, -1)
      : EVENT_TYPES.some((x) => x === t)
        ? null
        : `${t}.`;
    if (family === null) expanded.push(t as EventType);
    else {
      const members = EVENT_TYPES.filter((x) => x.startsWith(family));
      if (members.length === 0)
        throw new UsageError(`unknown event type "${t}"; types are: ${EVENT_TYPES.join(', ')}`);
      expanded.push(...members);
    }
  }
  return expanded;
}

export async function tailCommand(opts: TailOptions): Promise<number> {
  const limit = Number(opts.limit);
  if (!Number.isInteger(limit) || limit < 1 || limit > 10_000)
    throw new UsageError(`--limit must be an integer from 1 to 10000, got "${opts.limit}"`);
  const interval = Number(opts.intervalMs);
  if (!Number.isInteger(interval) || interval < 10)
    throw new UsageError('--interval-ms must be an integer of at least 10');
  const filter: TailFilter = { limit };
  if (opts.type) filter.type = parseTypes(opts.type);
  if (opts.room) filter.room = opts.room;
  if (opts.engine) filter.engine = opts.engine;
  if (opts.since) filter.since = parseTime(opts.since);
  const reader = new SqliteReader(opts.journal);
  const emit = (e: JournalEvent) =>
    opts.json ? process.stdout.write(`${JSON.stringify(e)}\n`) : print(eventRow(e));
  try {
    // With --since the question is "what happened from then on": the first events after it.
    const first = reader.tailSync({
      ...filter,
      order: filter.since !== undefined ? 'oldest' : 'newest',
    });
    first.forEach(emit);
    if (!opts.follow) return EXIT.ok;
    let last = first[first.length - 1]?.seq ?? (await reader.headSeq());
    note(`following ${opts.journal} after seq ${last}; Ctrl-C to stop`);
    await new Promise<void>((resolve) => {
      const timer = setInterval(() => {
        try {
          for (;;) {
            const next = reader.tailSync({
              ...filter,
              since: filter.since,
              afterSeq: last,
              order: 'oldest',
              limit: 1000,
            });
            next.forEach(emit);
            last = next[next.length - 1]?.seq ?? last;
            if (next.length < 1000) break;
          }
        } catch (err) {
          note(`tail: ${(err as Error).message}; retrying`);
        }
      }, interval);
      const stop = () => {
        clearInterval(timer);
        resolve();
      };
      process.once('SIGINT', stop);
      process.once('SIGTERM', stop);
    });
    return EXIT.ok;
  } finally {
    reader.close();
  }
}
