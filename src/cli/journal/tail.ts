/** `pdctl journal tail`: the newest events, or the first from --since on; --follow keeps going. */

import { UsageError } from '../../errors.ts';
import type { TailFilter } from '../../journal/store.ts';
import { EVENT_TYPES, type EventType, type JournalEvent } from '../../room/events.ts';
import { formatTs, parseTime } from '../../time.ts';
import { reaching, streamLines, UnreachableError } from '../api-client.ts';
import {
  type CommonOptions,
  EXIT,
  note,
  openReader,
  print,
  refuseUnknownName,
} from '../context.ts';
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
  /** A running pdctl serve to read instead of the journal file. */
  url?: string;
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

/** Stops on SIGINT or SIGTERM (Ctrl-C while following). */
function stopSignal(): AbortSignal {
  const ac = new AbortController();
  const stop = () => ac.abort();
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  return ac.signal;
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
  const emit = (e: JournalEvent) =>
    opts.json ? process.stdout.write(`${JSON.stringify(e)}\n`) : print(eventRow(e));
  const url = opts.url;
  if (url !== undefined) return reaching(null, () => tailServer(url, filter, !!opts.follow, emit));
  if (opts.archive !== undefined && opts.follow)
    throw new UsageError(
      '--follow reads a live journal; an archive does not change: leave one out',
    );
  return tailFile(opts, filter, !!opts.follow, interval, emit);
}

async function tailFile(
  opts: TailOptions,
  filter: TailFilter,
  follow: boolean,
  interval: number,
  emit: (e: JournalEvent) => void,
): Promise<number> {
  const path = opts.journal;
  const reader = openReader(opts, filter.since);
  try {
    // With --since the question is "what happened from then on": the first events after it.
    const first = await reader.tail({
      ...filter,
      order: filter.since !== undefined ? 'oldest' : 'newest',
    });
    if (first.length === 0 && !follow) await refuseUnknownName(reader, filter);
    first.forEach(emit);
    if (!follow) return EXIT.ok;
    let last = first[first.length - 1]?.seq ?? (await reader.headSeq());
    note(`following ${path} after seq ${last}; Ctrl-C to stop`);
    const signal = stopSignal();
    while (!signal.aborted) {
      try {
        for (;;) {
          const next = await reader.tail({
            ...filter,
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
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, interval);
        signal.addEventListener('abort', () => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    return EXIT.ok;
  } finally {
    reader.close();
  }
}

/**
 * The same from a running server: `/v1/journal`, with `follow=1` held open. A stream that breaks
 * (the server restarted) is taken up again after the last event printed, so none is missed or
 * printed twice.
 */
async function tailServer(
  url: string,
  filter: TailFilter,
  follow: boolean,
  emit: (e: JournalEvent) => void,
): Promise<number> {
  const query = (afterSeq: number | null) => {
    const q = new URLSearchParams();
    if (filter.type) q.set('type', [filter.type].flat().join(','));
    if (filter.room) q.set('room', filter.room);
    if (filter.engine) q.set('engine', filter.engine);
    if (afterSeq !== null) q.set('after_seq', String(afterSeq));
    else if (filter.since !== undefined) q.set('since', String(filter.since));
    q.set('limit', String(afterSeq !== null ? 10_000 : filter.limit));
    if (follow) q.set('follow', '1');
    return `/v1/journal?${q}`;
  };
  const signal = follow ? stopSignal() : new AbortController().signal;
  let last: number | null = null;
  /** Set while the server is away: said once, and again when events flow again. */
  let down = false;
  if (follow) note(`following ${url} (its /v1/journal); Ctrl-C to stop`);
  for (;;) {
    try {
      for await (const line of streamLines(url, query(last), signal)) {
        const e = JSON.parse(line) as JournalEvent;
        if (last !== null && e.seq <= last) continue;
        if (down) note(`tail: ${url} is back; going on after seq ${last}`);
        down = false;
        emit(e);
        last = e.seq;
      }
      if (!follow || signal.aborted) return EXIT.ok;
      if (!down) note(`tail: ${url} ended the stream; reconnecting after seq ${last ?? 0}`);
      down = true;
    } catch (err) {
      if (signal.aborted) return EXIT.ok;
      // Down at the start: say so and stop. Down later, while following: keep trying.
      if (!(err instanceof UnreachableError) || last === null) throw err;
      if (!down) note(`tail: ${err.message} Retrying every second after seq ${last}.`);
      down = true;
    }
    await new Promise((r) => setTimeout(r, 1000));
    if (signal.aborted) return EXIT.ok;
  }
}
