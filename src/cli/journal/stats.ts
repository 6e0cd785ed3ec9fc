/** `pdctl journal stats`: counts by state and reason, and per-minute transitions and prefix hits. */

import { CHECKPOINT_NAME } from '../../control/checkpoint/codec.ts';
import { UsageError } from '../../errors.ts';
import type { RetentionStatus } from '../../journal/retention.ts';
import {
  eachEvent,
  type JournalReader,
  type JournalStats,
  type StoredCheckpoint,
} from '../../journal/store.ts';
import type { JournalEventOf } from '../../room/events.ts';
import { formatDuration, formatTs, parseTime } from '../../time.ts';
import { callServer, errorOf, reaching, serverRoomReader } from '../api-client.ts';
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
    const url = opts.url as string;
    const r = await callServer<{ journal: JournalStats; retention: RetentionStatus | null }>(
      url,
      '/v1/stats',
    );
    if (r.status !== 200) throw new UsageError(errorOf(r.status, r.body));
    const pruned = await serverRoomReader(url).tail({ type: 'journal.pruned', limit: 1 });
    const retention = retentionOf(r.body.journal, pruned, r.body.retention);
    if (opts.json) printJson({ ...r.body.journal, retention });
    else printCounts(r.body.journal, undefined, retention);
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
    const retention = retentionOf(s, await reader.tail({ type: 'journal.pruned', limit: 1 }));
    if (opts.json) {
      const all = { ...s, stateCheckpoint, retention };
      printJson(minutes ? { ...all, perMinute: minutes, prefixPerMinute: prefix } : all);
      return EXIT.ok;
    }
    printCounts(s, cp, retention);
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

/**
 * Retention as an operator asks after it: the policy (known to a serving control plane only:
 * `undefined` read from a file), and what the journal says passes deleted — how many passes
 * deleted anything (each journals `journal.pruned`), and the last one.
 */
export interface RetentionView {
  policy?: RetentionStatus['policy'];
  /** A serving control plane's last pass, one that deleted nothing included. */
  lastPass?: RetentionStatus['last'];
  passes: number;
  last: (JournalEventOf<'journal.pruned'>['data'] & { at: number; seq: number }) | null;
}

function retentionOf(
  s: JournalStats,
  newest: JournalEventOf<'journal.pruned'>[],
  server?: RetentionStatus | null,
): RetentionView {
  const ev = newest[0];
  return {
    ...(server !== undefined
      ? { policy: server?.policy ?? null, lastPass: server?.last ?? null }
      : {}),
    passes: s.eventsByType['journal.pruned'] ?? 0,
    last: ev ? { ...ev.data, at: ev.ts, seq: ev.seq } : null,
  };
}

/** `retention` lines: the policy, the passes that deleted, the last one. */
function printRetention(r: RetentionView): void {
  const p = r.policy;
  print(
    `retention   ${
      p === undefined
        ? 'policy: read from a file, not known (the serve writing it has it: journal stats --url)'
        : p === null
          ? 'policy: none, this serve keeps every room (serve --retain sets a horizon; pdctl journal prune --url prunes once)'
          : `policy: rooms kept ${formatDuration(p.roomsMs)} after they end, events of no room ${p.eventsMs === null ? 'kept' : formatDuration(p.eventsMs)}; a pass every ${formatDuration(p.everyMs)}; ${p.archiveDir ? `archived first to ${p.archiveDir}` : 'no archive'}`
    }`,
  );
  const l = r.lastPass;
  if (l)
    print(
      `            last pass ${formatTs(l.startedAt)} (${l.by}${l.ms !== null ? `, ${formatDuration(l.ms)}` : ', running'}): ${l.error ? `failed: ${l.error}` : `${l.result.rooms} rooms, ${l.result.events + l.result.otherEvents} events deleted`}`,
    );
  const d = r.last;
  print(
    d
      ? `            ${r.passes} ${r.passes === 1 ? 'pass' : 'passes'} deleted; the last at ${formatTs(d.at)} (seq ${d.seq}): rooms that ended before ${formatTs(d.cutoffTs)} (${formatDuration(d.at - d.cutoffTs)} before it), ${d.rooms} rooms with ${d.events} events${d.otherEvents ? `, ${d.otherEvents} events of no room before ${formatTs(d.eventsCutoffTs ?? null)}` : ''}; ${d.archived ? 'archived first' : 'not archived'}`
      : '            nothing was ever pruned from this journal',
  );
}

/** The counts as `journal stats` prints them; `cp` undefined: not known (read through a server). */
function printCounts(
  s: JournalStats,
  cp: StoredCheckpoint | null | undefined,
  retention: RetentionView,
): void {
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
  printRetention(retention);
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
