/** `pdctl rooms` and `pdctl room <id>`: what was in flight, and what happened to one room. */

import type { Command } from 'commander';
import { UsageError } from '../errors.ts';
import { describeRefusal } from '../journal/refusal-text.ts';
import { HIDDEN_ORIGINS, originFilter, type RoomFilter, type Timeline } from '../journal/store.ts';
import type { JournalEvent } from '../room/events.ts';
import { isRequestId, isValidId, roomIdOf, roomIdTime } from '../room/ids.ts';
import { isRoomState, ROOM_STATES, type RoomState } from '../room/states.ts';
import { formatDuration, formatTs, parseTime } from '../time.ts';
import {
  type RoomReader,
  reaching,
  readTarget,
  serverRoomReader,
  READ_URL_HELP as URL_HELP,
} from './api-client.ts';
import {
  ARCHIVE_HELP,
  type CommonOptions,
  EXIT,
  openReader,
  print,
  printJson,
  refuseUnknownName,
} from './context.ts';
import { describeEvent, describeMissingRoom, describeUnkept, roomOutcome } from './describe.ts';
import { renderTable } from './table.ts';

/** `--url`: read a running pdctl serve instead of the journal file. */
interface RemoteOption {
  url?: string;
}

/** The journal file, or the running server's query routes (--url, or env PDCTL_URL). */
function roomReader(opts: CommonOptions & RemoteOption, since?: number): RoomReader {
  return opts.url !== undefined ? serverRoomReader(opts.url) : openReader(opts, since);
}

/** The options with `url` set when the command reads a server (see readTarget). */
function targeted<T extends CommonOptions & RemoteOption>(opts: T, cmd: Command): T {
  const target = readTarget(opts, cmd);
  return 'url' in target ? { ...opts, url: target.url } : { ...opts, url: undefined };
}

interface RoomsOptions extends CommonOptions, RemoteOption {
  state?: string;
  engine?: string;
  reason?: string;
  requestId?: string;
  tenant?: string;
  since?: string;
  until?: string;
  inFlightAt?: string;
  origin?: string;
  limit: string;
  cursor?: string;
}

function parseStates(input: string): RoomState[] {
  const states = input.split(',').map((s) => s.trim());
  for (const s of states) {
    if (!isRoomState(s))
      throw new UsageError(`unknown state "${s}"; states are: ${ROOM_STATES.join(', ')}`);
  }
  return states as RoomState[];
}

function parseLimit(input: string): number {
  const n = Number(input);
  if (!Number.isInteger(n) || n < 1 || n > 10_000)
    throw new UsageError(`--limit must be an integer from 1 to 10000, got "${input}"`);
  return n;
}

export async function roomsCommand(opts: RoomsOptions): Promise<number> {
  const now = Date.now();
  const filter: RoomFilter = { limit: parseLimit(opts.limit) };
  if (opts.state) filter.state = parseStates(opts.state);
  if (opts.engine) filter.engine = opts.engine;
  if (opts.reason) filter.reason = opts.reason;
  if (opts.requestId) filter.requestId = opts.requestId;
  if (opts.tenant) filter.tenant = opts.tenant;
  if (opts.since) filter.since = parseTime(opts.since, now);
  if (opts.until) filter.until = parseTime(opts.until, now);
  if (opts.inFlightAt) filter.inFlightAt = parseTime(opts.inFlightAt, now);
  try {
    Object.assign(filter, originFilter(opts.origin));
  } catch (err) {
    throw new UsageError(`--${(err as Error).message}`);
  }
  if (opts.cursor) filter.cursor = opts.cursor;
  // Rooms alive at or after since (or at inFlightAt) ended then or later.
  const since = filter.since ?? filter.inFlightAt;
  // A server answers a name it does not hold itself (400); a file is asked here.
  const file = opts.url === undefined ? openReader(opts, since) : null;
  const reader = file ?? roomReader(opts, since);
  try {
    const page = await reader.rooms(filter);
    if (file && page.rooms.length === 0 && filter.cursor === undefined)
      await refuseUnknownName(file, filter);
    // A request refused before it had a room is on the record only as a refusal.
    const refusals =
      filter.requestId && page.rooms.length === 0
        ? await reader.tail({ type: 'request.refused', requestId: filter.requestId, limit: 20 })
        : [];
    if (opts.json) {
      printJson(refusals.length > 0 ? { ...page, refusals } : page);
      return EXIT.ok;
    }
    const hidden =
      opts.origin === undefined
        ? ` (${HIDDEN_ORIGINS.join(', ')} rooms not shown: --origin all)`
        : '';
    if (page.rooms.length === 0) {
      if (refusals.length === 0) print(`no rooms match${hidden}`);
      const unkept =
        filter.requestId && refusals.length === 0
          ? describeUnkept(await reader.tail({ type: 'request.refused', limit: 10_000 }))
          : null;
      if (unkept) print(unkept);
      for (const ev of refusals)
        print(`no room: request ${filter.requestId} ${describeRefusal(ev)}`);
      return EXIT.ok;
    }
    const at = filter.inFlightAt;
    print(
      renderTable(page.rooms, [
        { header: 'ROOM', value: (r) => r.room },
        { header: at !== undefined ? 'STATE NOW' : 'STATE', value: (r) => r.state },
        { header: 'PAIR', value: (r) => `${r.prefillEngine}→${r.decodeEngine}` },
        { header: 'CREATED', value: (r) => formatTs(r.createdAt) },
        {
          header: at !== undefined ? 'AGE AT T' : 'LIFETIME',
          value: (r) => formatDuration((at ?? r.terminalAt ?? now) - r.createdAt),
          align: 'right',
        },
        { header: 'ORIGIN', value: (r) => r.origin },
        { header: 'OUTCOME', value: (r) => roomOutcome(r) },
      ]),
    );
    if (page.nextCursor) print(`\nmore rooms: add --cursor ${page.nextCursor}`);
    if (hidden) print(`\n${hidden.slice(2, -1)}`);
    return EXIT.ok;
  } finally {
    reader.close();
  }
}

/**
 * `pdctl room <id>`: the room's timeline; an id that names no room but a request (its
 * `x-request-id`) shows each room of that request, oldest first (more than one: it migrated).
 */
export async function roomCommand(id: string, opts: CommonOptions & RemoteOption): Promise<number> {
  const reader = roomReader(opts);
  try {
    const t = isValidId(id) ? await reader.timeline(id) : { room: null, events: [], spans: [] };
    if (!t.room && t.events.length === 0) {
      const page = await reader.rooms({ requestId: id, limit: 100 });
      const rooms = [...page.rooms].reverse();
      if (rooms.length === 0) {
        // A request refused before it had a room is on the record only as a refusal.
        const refusals = await reader.tail({ type: 'request.refused', requestId: id, limit: 20 });
        if (opts.json) printJson(refusals.length > 0 ? { request_id: id, rooms: [], refusals } : t);
        else if (refusals.length > 0)
          for (const ev of refusals) print(`request ${id}: ${describeRefusal(ev)}`);
        else {
          const pruned = await reader.tail({
            type: 'journal.pruned',
            // Oldest first, from a file or a server (after_seq asks the route for that order).
            afterSeq: 0,
            order: 'oldest',
            limit: 10_000,
          });
          const why = describeMissingRoom(roomIdTime(id), pruned) ?? 'pruned, or never created';
          print(`no room and no request ${id} in ${opts.url ?? opts.journal} (${why})`);
          const unkept = describeUnkept(
            await reader.tail({ type: 'request.refused', limit: 10_000 }),
          );
          if (unkept) print(unkept);
        }
        return refusals.length > 0 ? EXIT.ok : EXIT.problem;
      }
      const timelines = await Promise.all(rooms.map((r) => reader.timeline(r.room)));
      if (opts.json) {
        printJson({ request_id: id, rooms: timelines });
        return EXIT.ok;
      }
      print(
        `request ${id}: ${rooms.length === 1 ? 'room' : `${rooms.length} rooms`} ${rooms.map((r) => r.room).join(' → ')}\n`,
      );
      timelines.forEach((tl, i) => {
        if (i > 0) print('');
        printTimeline(tl.room?.room ?? '', tl);
      });
      return EXIT.ok;
    }
    if (opts.json) {
      printJson(t);
      return t.room ? EXIT.ok : EXIT.problem;
    }
    printTimeline(id, t);
    return EXIT.ok;
  } finally {
    reader.close();
  }
}

/** One room's projection, its events and the time it spent in each state, as tables. */
function printTimeline(id: string, t: Timeline): void {
  const r = t.room;
  if (r) {
    const end = r.terminalAt ?? Date.now();
    print(`room ${r.room}: ${r.state}${roomOutcome(r) ? ` (${roomOutcome(r)})` : ''}`);
    print(`  pair      ${r.prefillEngine} → ${r.decodeEngine}`);
    print(`  origin    ${r.origin}`);
    print(`  created   ${formatTs(r.createdAt)}`);
    print(
      `  ${r.terminalAt ? 'ended    ' : 'running  '} ${r.terminalAt ? formatTs(r.terminalAt) : `for ${formatDuration(end - r.createdAt)}, deadline of ${r.state} at ${formatTs(r.deadlineAt)}`}`,
    );
    print(`  lifetime  ${formatDuration(end - r.createdAt)}`);
    const prefix = prefixOf(t.events);
    if (prefix) print(`  prefix    ${prefix}`);
    if (r.migratedFrom) print(`  migrated from ${r.migratedFrom}`);
    if (r.abortRequestedAt !== null)
      print(`  abort requested at ${formatTs(r.abortRequestedAt)} (${r.abortReason})`);
    print(`  released  ${r.releasedBy.length ? r.releasedBy.join(', ') : 'none'}`);
  } else {
    print(`room ${id}: only rejected events (the room itself was never created)`);
  }
  const t0 = t.events[0]?.ts ?? 0;
  print('\ntimeline');
  print(
    renderTable(t.events, [
      { header: 'SEQ', value: (e) => e.seq, align: 'right' },
      { header: 'TIME', value: (e) => formatTs(e.ts) },
      { header: '+T', value: (e) => formatDuration(e.ts - t0), align: 'right' },
      { header: 'EVENT', value: (e) => e.type },
      { header: 'ENGINE', value: (e) => e.engine },
      { header: 'DETAIL', value: (e) => describeEvent(e) },
    ]),
  );
  if (t.spans.length) {
    print('\ntime in each state');
    print(
      renderTable(t.spans, [
        { header: 'STATE', value: (s) => s.state },
        { header: 'ENTERED', value: (s) => formatTs(s.from) },
        {
          header: 'TIME',
          value: (s) =>
            s.ms === null
              ? r?.terminalAt
                ? 'final'
                : `${formatDuration(Date.now() - s.from)} so far`
              : formatDuration(s.ms),
          align: 'right',
        },
      ]),
    );
  }
}

export function registerRoomCommands(
  program: Command,
  journalOption: (c: Command) => Command,
): void {
  journalOption(
    program
      .command('rooms')
      .description('list rooms, newest first: what was in flight, what failed and why')
      .option('--state <states>', `comma-separated states (${ROOM_STATES.join(', ')})`)
      .option('--engine <id>', 'rooms whose prefill or decode engine is <id>')
      .option(
        '--reason <reason>',
        'abort or failure reason, e.g. deadline_exceeded, client_disconnect',
      )
      .option(
        '--request-id <id>',
        'the rooms of one request (its x-request-id, or the one pdctl made)',
      )
      .option('--tenant <name>', 'the rooms of one tenant (whose key the requests came with)')
      .option('--since <time>', 'rooms alive at or after this time')
      .option('--until <time>', 'rooms created at or before this time')
      .option('--in-flight-at <time>', 'rooms created by T and not yet terminal at T')
      .option(
        '--origin <origins>',
        'who created them: comma-separated (api, migration, canary, …) or all; default: all but the health canary',
      )
      .option('--limit <n>', 'most rooms to list (1-10000)', '50')
      .option('--cursor <cursor>', 'the next page, as printed after a full page')
      .addHelpText(
        'after',
        '\nTimes: ISO-8601 (2026-11-30T03:12:00Z), an age (10m, 2h, 7d), a UTC clock time (03:12), or unix ms.\n' +
          'Example: pdctl rooms --in-flight-at 03:12 --state transferring',
      ),
  )
    .option('--url <url>', URL_HELP)
    .option('--archive <dir>', ARCHIVE_HELP)
    .action(async (opts: RoomsOptions, cmd: Command) => {
      const o = targeted(opts, cmd);
      process.exitCode = await reaching(null, () => roomsCommand(o));
    });

  journalOption(
    program
      .command('room')
      .argument(
        '<id>',
        'room id, as printed by `pdctl rooms`, the completion id a client got (cmpl-r-…), or the request id (x-request-id) of its request',
      )
      .description(
        "one room's timeline: every event, and the time it spent in each state; a request id shows each room of its request",
      ),
  )
    .option('--url <url>', URL_HELP)
    .option('--archive <dir>', ARCHIVE_HELP)
    .action(async (given: string, opts: CommonOptions & RemoteOption, cmd: Command) => {
      const id = roomIdOf(given);
      if (!isValidId(id) && !isRequestId(id))
        throw new UsageError(
          `"${given}" is neither a room id nor a request id (printable, no spaces, at most 128 characters)`,
        );
      const o = targeted(opts, cmd);
      process.exitCode = await reaching(null, () => roomCommand(id, o));
    });
}

/** What the router expected of the prefill engine's prefix cache for a room, and what it reused. */
function prefixOf(events: readonly JournalEvent[]): string | null {
  let blocks: number | undefined;
  let expected = 0;
  let reused: string | null = null;
  for (const e of events) {
    if (e.type === 'room.created') {
      blocks = e.data.prefixBlocks;
      expected = e.data.expectedBlocks ?? 0;
    } else if (e.type === 'room.transfer_posted')
      reused =
        e.data.reusedBlocks === undefined
          ? 'none reused (its prefill engine keeps no cache)'
          : `${e.data.reusedBlocks} reused`;
  }
  if (blocks === undefined) return null;
  return `${blocks} blocks: ${expected} expected cached, ${reused ?? 'not prefilled yet'}`;
}
