/** `pdctl journal stats`: counts by state and reason, and per-minute transitions and prefix hits. */

import { CHECKPOINT_NAME } from '../../control/checkpoint/codec.ts';
import { UsageError } from '../../errors.ts';
import {
  eachEvent,
  type JournalReader,
  type JournalStats,
  type StoredCheckpoint,
} from '../../journal/store.ts';
import { formatTs, parseTime } from '../../time.ts';
import { callServer, errorOf, reaching } from '../api-client.ts';
import { type CommonOptions, EXIT, openReader, print, printJson } from '../context.ts';
import { renderTable } from '../table.ts';

export interface StatsOptions extends CommonOptions {
  perMinute?: boolean;
  since?: string;
  until?: string;
  /** A running server's counts instead (`GET /v1/stats`); set from --url or PDCTL_URL. */
  url?: string;
}

/** The counts of a running `pdctl serve`: its journal's, as `/v1/stats` has them. */
async function serverStats(opts: StatsOptions): Promise<number> {
  if (opts.perMinute)
    throw new UsageError(
      '--per-minute reads the journal itself: run it where the journal is (--journal PATH reads it beside a running serve)',
    );
  return reaching(null, async () => {
    const r = await callServer<{ journal: JournalStats }>(opts.url as string, '/v1/stats');
    if (r.status !== 200) throw new UsageError(errorOf(r.status, r.body));
    if (opts.json) printJson(r.body.journal);
    else printCounts(r.body.journal, undefined);
    return EXIT.ok;
  });
}

export async function statsCommand(opts: StatsOptions): Promise<number> {
  if (opts.url !== undefined) return serverStats(opts);
  const reader = openReader(opts);
  try {
    const s = await reader.stats();
    const now = Date.now();
    const window = opts.perMinute
      ? {
          since: opts.since ? parseTime(opts.since, now) : (s.lastTs ?? now) - 15 * 60_000,
          until: opts.until ? parseTime(opts.until, now) : (s.lastTs ?? now) + 1,
        }
      : null;
    const minutes = window ? await reader.perMinute(window) : null;
    const prefix = window ? await prefixPerMinute(reader, window) : null;
    const cp = await reader.getCheckpoint(CHECKPOINT_NAME);
    const stateCheckpoint = cp && { seq: cp.seq, writtenAt: cp.writtenAt, format: cp.format };
    if (opts.json) {
      const all = { ...s, stateCheckpoint };
      printJson(minutes ? { ...all, perMinute: minutes, prefixPerMinute: prefix } : all);
      return EXIT.ok;
    }
    printCounts(s, cp);
    if (minutes && window) {
      print(`\nper minute, ${formatTs(window.since)} .. ${formatTs(window.until)}`);
      if (!minutes.length) print('no room transitions in this window');
      else
        print(
          renderTable(minutes, [
            { header: 'MINUTE', value: (m) => formatTs(m.minute).slice(0, 16) },
            { header: 'ENTERED', value: (m) => m.state },
            { header: 'REASON', value: (m) => m.reason },
            { header: 'COUNT', value: (m) => m.count, align: 'right' },
          ]),
        );
    }
    if (prefix?.length) {
      print(
        '\nprefix blocks per minute (rooms whose KV was posted; hit rate: blocks reused of blocks)',
      );
      print(
        renderTable(prefix, [
          { header: 'MINUTE', value: (m) => formatTs(m.minute).slice(0, 16) },
          { header: 'ROOMS', value: (m) => m.rooms, align: 'right' },
          { header: 'BLOCKS', value: (m) => m.blocks, align: 'right' },
          { header: 'EXPECTED', value: (m) => m.expected, align: 'right' },
          { header: 'REUSED', value: (m) => m.reused, align: 'right' },
          { header: 'HIT RATE', value: (m) => percent(m.reused, m.blocks), align: 'right' },
          { header: 'EVICTED', value: (m) => m.evicted, align: 'right' },
        ]),
      );
    }
    return EXIT.ok;
  } finally {
    reader.close();
  }
}

/** The counts as `journal stats` prints them; `cp` undefined: not known (read through a server). */
function printCounts(s: JournalStats, cp: StoredCheckpoint | null | undefined): void {
  // The file over its rooms: what to size a disk by for a retention horizon (journal.md, Retention).
  const perRoom = s.rooms > 0 ? `, ${Math.round(s.fileBytes / s.rooms)} bytes a room` : '';
  print(
    `journal     ${s.path} (schema ${s.schemaVersion}, ${(s.fileBytes / 1048576).toFixed(1)} MiB${perRoom})`,
  );
  print(`events      ${s.events}${s.firstSeq !== null ? `, seq ${s.firstSeq}..${s.lastSeq}` : ''}`);
  print(`time span   ${formatTs(s.firstTs)} .. ${formatTs(s.lastTs)}`);
  print(
    `rooms       ${s.rooms}${s.packedRooms ? ` (${s.packedRooms} packed: docs/journal.md, Packed rooms)` : ''}`,
  );
  print(`rejected    ${s.rejectedEvents} events recorded as room.event_rejected`);
  print(
    `checkpoint  ${cp === undefined ? 'not read through a server (journal stats --journal PATH shows it)' : cp ? `state through seq ${cp.seq} (${(s.lastSeq ?? cp.seq) - cp.seq} events before the head), written ${formatTs(cp.writtenAt)}` : 'none: a control plane starting on it folds the whole journal'}`,
  );
  const states = Object.entries(s.byState).sort((a, b) => b[1] - a[1]);
  if (states.length) {
    print('\nrooms by state');
    print(
      renderTable(states, [
        { header: 'STATE', value: (r) => r[0] },
        { header: 'ROOMS', value: (r) => r[1], align: 'right' },
      ]),
    );
  }
  for (const [title, table, unit] of [
    ['failures by reason', s.failuresByReason, 'ROOMS'],
    ['aborts by reason', s.abortsByReason, 'ROOMS'],
    ['requests refused before a room, by reason', s.refusalsByReason, 'REQUESTS'],
  ] as const) {
    const rows = Object.entries(table);
    if (!rows.length) continue;
    print(`\n${title}`);
    print(
      renderTable(rows, [
        { header: 'REASON', value: (r) => r[0] },
        { header: unit, value: (r) => r[1], align: 'right' },
      ]),
    );
  }
  if (s.consumers.length) {
    print('\nconsumers');
    print(
      renderTable(s.consumers, [
        { header: 'NAME', value: (c) => c.name },
        { header: 'SEQ', value: (c) => c.seq, align: 'right' },
        { header: 'UPDATED', value: (c) => formatTs(c.updatedAt) },
      ]),
    );
  }
  if (s.leaders?.length) {
    print('\nleaders (PostgreSQL)');
    print(
      renderTable(s.leaders, [
        { header: 'TERM', value: (l) => l.term, align: 'right' },
        { header: 'SINCE', value: (l) => formatTs(l.acquiredAt) },
        { header: 'HOW', value: (l) => l.how },
        { header: 'EVENTS', value: (l) => l.events, align: 'right' },
        { header: 'HOLDER', value: (l) => l.holder },
      ]),
    );
  }
}

/** One minute of prefix reuse: rooms whose KV was posted in it, and their blocks. */
export interface PrefixMinute {
  minute: number;
  rooms: number;
  /** Full prefix blocks of those rooms' contexts. */
  blocks: number;
  /** Blocks the router expected their prefill engines to hold. */
  expected: number;
  /** Blocks the engines reused. */
  reused: number;
  /** Blocks the caches evicted. */
  evicted: number;
}

/** Rooms are counted in the minute their KV was posted; their `room.created` may be up to this much earlier. */
const CREATED_BEFORE_MS = 10 * 60_000;

/**
 * Prefix reuse per minute in a window, from `room.created` (blocks, expected) and
 * `room.transfer_posted` (reused, evicted); `room.prefill_started` evictions count too.
 */
export async function prefixPerMinute(
  reader: JournalReader,
  window: { since: number; until: number },
): Promise<PrefixMinute[]> {
  const created = new Map<string, { blocks: number; expected: number }>();
  const minutes = new Map<number, PrefixMinute>();
  const at = (ts: number) => {
    const minute = Math.floor(ts / 60_000) * 60_000;
    let m = minutes.get(minute);
    if (!m) {
      m = { minute, rooms: 0, blocks: 0, expected: 0, reused: 0, evicted: 0 };
      minutes.set(minute, m);
    }
    return m;
  };
  const types = ['room.created', 'room.prefill_started', 'room.transfer_posted'] as const;
  await eachEvent(reader, { type: [...types], since: window.since - CREATED_BEFORE_MS }, (ev) => {
    if (ev.ts >= window.until) return false;
    if (ev.type === 'room.created') {
      const { prefixBlocks, expectedBlocks } = ev.data;
      if (prefixBlocks !== undefined && ev.room)
        created.set(ev.room, { blocks: prefixBlocks, expected: expectedBlocks ?? 0 });
      return true;
    }
    if (ev.ts < window.since) return true;
    const m = at(ev.ts);
    m.evicted += ev.data.evictedBlocks?.length ?? 0;
    if (ev.type !== 'room.transfer_posted') return true;
    const c = ev.room ? created.get(ev.room) : undefined;
    m.rooms++;
    m.blocks += c?.blocks ?? 0;
    m.expected += c?.expected ?? 0;
    m.reused += ev.data.reusedBlocks ?? 0;
    return true;
  });
  return [...minutes.values()].sort((a, b) => a.minute - b.minute);
}

function percent(part: number, whole: number): string {
  return whole === 0 ? '-' : `${((100 * part) / whole).toFixed(1)} %`;
}
