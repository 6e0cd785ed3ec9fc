import { existsSync, renameSync, rmSync, statSync } from 'node:fs';
/** `pdctl journal …`: verify, tail, stats, prune, synth, migrate. */
import type { Command } from 'commander';
import { EVENT_TYPES, type EventType, type JournalEvent } from '../journal/events.ts';
import { SqliteJournal } from '../journal/sqlite/journal.ts';
import { headVersion, schemaVersion } from '../journal/sqlite/migrate.ts';
import { DURABILITIES, type Durability, openDatabase } from '../journal/sqlite/open.ts';
import { acquireWriterLock } from '../journal/sqlite/writer-lock.ts';
import type { TailFilter } from '../journal/store.ts';
import { synthEvents } from '../journal/synth.ts';
import {
  type CommonOptions,
  EXIT,
  note,
  openReader,
  print,
  printJson,
  VERSION,
} from './context.ts';
import { describeEvent } from './describe.ts';
import { renderTable } from './table.ts';
import { formatDuration, formatTs, parseDuration, parseTime, UsageError } from './time.ts';

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

async function verifyCommand(opts: CommonOptions): Promise<number> {
  const reader = openReader(opts);
  try {
    const r = await reader.verify();
    if (opts.json) {
      printJson(r);
      return r.ok ? EXIT.ok : EXIT.problem;
    }
    const mark = (ok: boolean) => (ok ? 'ok  ' : 'FAIL');
    print(`${mark(r.integrity === 'ok')}  sqlite integrity_check: ${r.integrity}`);
    print(
      `${mark(r.problems.length === 0)}  events: ${r.events} in seq order${r.problems.length ? `; ${r.problems.join('; ')}` : ''}`,
    );
    print(
      `${mark(r.inconsistent.length === 0)}  every applied event folds${r.inconsistent.length ? `; ${r.inconsistent.length} do not, first: seq ${r.inconsistent[0]?.seq} ${r.inconsistent[0]?.reason}` : ''}`,
    );
    const projOk = r.mismatches.length === 0 && r.missing.length === 0 && r.extra.length === 0;
    print(`${mark(projOk)}  rooms projection equals the fold of events (${r.rooms} rooms)`);
    for (const m of r.mismatches.slice(0, 20)) {
      print(
        `        room ${m.room}: ${m.field} is ${JSON.stringify(m.projection)} in rooms, ${JSON.stringify(m.fold)} by the fold`,
      );
    }
    if (r.missing.length) print(`        missing from rooms: ${r.missing.slice(0, 20).join(', ')}`);
    if (r.extra.length)
      print(`        in rooms but never created: ${r.extra.slice(0, 20).join(', ')}`);
    print(
      `${r.ok ? 'journal is consistent' : 'journal is NOT consistent'} (checked in ${formatDuration(r.micros / 1000)})`,
    );
    return r.ok ? EXIT.ok : EXIT.problem;
  } finally {
    reader.close();
  }
}

interface TailOptions extends CommonOptions {
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

async function tailCommand(opts: TailOptions): Promise<number> {
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
  const reader = openReader(opts);
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

interface StatsOptions extends CommonOptions {
  perMinute?: boolean;
  since?: string;
  until?: string;
}

async function statsCommand(opts: StatsOptions): Promise<number> {
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
    if (opts.json) {
      printJson(minutes ? { ...s, perMinute: minutes } : s);
      return EXIT.ok;
    }
    print(
      `journal     ${s.path} (schema ${s.schemaVersion}, ${(s.fileBytes / 1048576).toFixed(1)} MiB)`,
    );
    print(
      `events      ${s.events}${s.firstSeq !== null ? `, seq ${s.firstSeq}..${s.lastSeq}` : ''}`,
    );
    print(`time span   ${formatTs(s.firstTs)} .. ${formatTs(s.lastTs)}`);
    print(`rooms       ${s.rooms}`);
    print(`rejected    ${s.rejectedEvents} events recorded as room.event_rejected`);
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
    for (const [title, table] of [
      ['failures by reason', s.failuresByReason],
      ['aborts by reason', s.abortsByReason],
    ] as const) {
      const rows = Object.entries(table);
      if (!rows.length) continue;
      print(`\n${title}`);
      print(
        renderTable(rows, [
          { header: 'REASON', value: (r) => r[0] },
          { header: 'ROOMS', value: (r) => r[1], align: 'right' },
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
    return EXIT.ok;
  } finally {
    reader.close();
  }
}

interface PruneOptions extends CommonOptions {
  olderThan: string;
  chunk: string;
  dryRun?: boolean;
}

async function pruneCommand(opts: PruneOptions): Promise<number> {
  const age = parseDuration(opts.olderThan, '--older-than');
  const chunk = Number(opts.chunk);
  if (!Number.isInteger(chunk) || chunk < 1 || chunk > 100_000)
    throw new UsageError('--chunk must be an integer from 1 to 100000');
  const cutoffTs = Date.now() - age;
  if (opts.dryRun) {
    const reader = openReader(opts);
    try {
      const n = reader.countPrunable(cutoffTs);
      if (opts.json) printJson({ cutoffTs, rooms: n.rooms, events: n.events, dryRun: true });
      else
        print(
          `would delete ${n.rooms} terminal rooms (${n.events} events) that ended before ${formatTs(cutoffTs)}`,
        );
      return EXIT.ok;
    } finally {
      reader.close();
    }
  }
  const journal = await SqliteJournal.open({ path: opts.journal, create: false });
  try {
    const r = await journal.prune({ cutoffTs, chunkRooms: chunk });
    if (opts.json) printJson(r);
    else
      print(
        `deleted ${r.rooms} terminal rooms (${r.events} events) that ended before ${formatTs(cutoffTs)}, in ${r.batches} chunks; live rooms are never pruned`,
      );
    return EXIT.ok;
  } finally {
    await journal.drain();
  }
}

interface SynthOptions extends CommonOptions {
  rooms: string;
  seed: string;
  span: string;
  end: string;
  durability: string;
  prefill: string;
  decode: string;
  incidents: string;
}

function parseDurability(input: string): Durability {
  if (!(DURABILITIES as readonly string[]).includes(input))
    throw new UsageError(`--durability must be one of ${DURABILITIES.join(', ')}, got "${input}"`);
  return input as Durability;
}

async function synthCommand(opts: SynthOptions): Promise<number> {
  const rooms = Number(opts.rooms);
  if (!Number.isInteger(rooms) || rooms < 1 || rooms > 10_000_000)
    throw new UsageError(`--rooms must be an integer from 1 to 10000000, got "${opts.rooms}"`);
  const seed = Number(opts.seed);
  if (!Number.isInteger(seed))
    throw new UsageError(`--seed must be an integer, got "${opts.seed}"`);
  const durability = parseDurability(opts.durability);
  const engines = (s: string, flag: string) => {
    const list = s
      .split(',')
      .map((x) => x.trim())
      .filter(Boolean);
    if (!list.length) throw new UsageError(`${flag} needs at least one engine id`);
    return list;
  };
  const options = {
    rooms,
    seed,
    spanMs: parseDuration(opts.span, '--span'),
    endTs: parseTime(opts.end),
    prefill: engines(opts.prefill, '--prefill'),
    decode: engines(opts.decode, '--decode'),
    incidents: Number(opts.incidents),
  };
  if (!Number.isInteger(options.incidents) || options.incidents < 0 || options.incidents > 1000) {
    throw new UsageError(`--incidents must be an integer from 0 to 1000, got "${opts.incidents}"`);
  }
  const journal = await SqliteJournal.open({
    path: opts.journal,
    durability,
    announce: { source: 'synth', version: VERSION },
  });
  const started = performance.now();
  const progress = { roomsStarted: 0 };
  const counts = { applied: 0, rejected: 0, duplicate: 0 };
  let appended = 0;
  let lastNote = started;
  const window = new Set<Promise<void>>();
  // Ctrl-C stops generating; what was appended is committed before exit, so the journal is whole.
  let interrupted = false;
  const stop = () => {
    interrupted = true;
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  try {
    for (const ev of synthEvents(options, progress)) {
      if (interrupted) break;
      const p = journal.append(ev).then((r) => {
        counts[r.status]++;
        window.delete(p);
      });
      window.add(p);
      appended++;
      if (window.size >= 2048) await Promise.race(window);
      const t = performance.now();
      if (t - lastNote > 1000) {
        lastNote = t;
        note(
          `synth: ${progress.roomsStarted}/${rooms} rooms, ${appended} events, ${Math.round(appended / ((t - started) / 1000))} events/s`,
        );
      }
    }
    await Promise.all(window);
  } finally {
    process.off('SIGINT', stop);
    process.off('SIGTERM', stop);
    await journal.drain();
  }
  if (interrupted) {
    note(
      `synth: interrupted after ${appended} events; every one of them is committed and the journal is consistent`,
    );
    return EXIT.interrupted;
  }
  const secs = (performance.now() - started) / 1000;
  const summary = {
    journal: opts.journal,
    rooms,
    events: appended,
    ...counts,
    seconds: Number(secs.toFixed(2)),
    eventsPerSecond: Math.round(appended / secs),
  };
  if (opts.json) printJson(summary);
  else
    print(
      `wrote ${appended} events for ${rooms} rooms to ${opts.journal} in ${secs.toFixed(1)}s (${summary.eventsPerSecond} events/s; ${counts.rejected} rejected as late, as real races produce)`,
    );
  return EXIT.ok;
}

interface BackupOptions extends CommonOptions {
  to: string;
  force?: boolean;
}

/** A consistent copy of a journal, safe while pdctl is writing it (SQLite's online backup). */
async function backupCommand(opts: BackupOptions): Promise<number> {
  if (existsSync(opts.to) && !opts.force) {
    throw new UsageError(
      `${opts.to} already exists; pick another name or pass --force to overwrite it`,
    );
  }
  const db = openDatabase({ path: opts.journal, readonly: true, allowOlder: true });
  const started = performance.now();
  let lastNote = started;
  // Written under another name and renamed when whole: an interrupted backup never leaves a
  // file that looks like a usable journal.
  const partial = `${opts.to}.partial`;
  try {
    await db.backup(partial, {
      progress: ({ totalPages, remainingPages }) => {
        const t = performance.now();
        if (t - lastNote > 1000) {
          lastNote = t;
          note(`backup: ${totalPages - remainingPages}/${totalPages} pages`);
        }
        return 1000;
      },
    });
    renameSync(partial, opts.to);
  } catch (err) {
    rmSync(partial, { force: true });
    throw err;
  } finally {
    db.close();
  }
  const bytes = statSync(opts.to).size;
  const result = {
    from: opts.journal,
    to: opts.to,
    bytes,
    seconds: Number(((performance.now() - started) / 1000).toFixed(2)),
  };
  if (opts.json) printJson(result);
  else
    print(
      `copied ${opts.journal} to ${opts.to} (${(bytes / 1048576).toFixed(1)} MiB) in ${result.seconds}s; check it with pdctl journal verify --journal ${opts.to}`,
    );
  return EXIT.ok;
}

async function migrateCommand(opts: CommonOptions): Promise<number> {
  const db = openDatabase({ path: opts.journal, readonly: true, allowOlder: true });
  const before = schemaVersion(db) ?? 0;
  db.close();
  const head = headVersion();
  if (before === head) {
    print(`${opts.journal} is at schema ${head}, the newest this pdctl knows; nothing to do`);
    return EXIT.ok;
  }
  // A writing open applies every pending migration, each in its own transaction.
  const lock = acquireWriterLock(opts.journal);
  try {
    openDatabase({ path: opts.journal, durability: 'power' }).close();
  } finally {
    lock.release();
  }
  print(`${opts.journal}: schema ${before} → ${head}`);
  return EXIT.ok;
}

export function registerJournalCommands(
  program: Command,
  journalOption: (c: Command) => Command,
): void {
  const journal = program.command('journal').description('inspect and maintain the room journal');

  journalOption(
    journal
      .command('verify')
      .description(
        'check integrity and rebuild the rooms projection from events; exit 1 if anything differs',
      ),
  ).action(async (opts: CommonOptions) => {
    process.exitCode = await verifyCommand(opts);
  });

  journalOption(
    journal
      .command('tail')
      .description(
        'print the newest events (or the first ones from --since on), oldest first; --follow keeps printing new ones',
      )
      .option('-f, --follow', 'keep printing events as they are committed')
      .option(
        '--type <types>',
        'comma-separated event types or families (room.failed, engine, recovery.*)',
      )
      .option('--room <id>', 'only this room')
      .option('--engine <id>', 'only events from this engine')
      .option(
        '--since <time>',
        'start at this time and print the first events from then on (ISO-8601, 10m, 03:12, unix ms)',
      )
      .option('-n, --limit <n>', 'events to print first (1-10000)', '50')
      .option('--interval-ms <ms>', 'poll interval with --follow', '250'),
  ).action(async (opts: TailOptions) => {
    process.exitCode = await tailCommand(opts);
  });

  journalOption(
    journal
      .command('stats')
      .description(
        'counts: events, rooms by state, failures and aborts by reason; --per-minute for a window',
      )
      .option('--per-minute', 'transitions per minute by state entered and reason')
      .option(
        '--since <time>',
        'window start for --per-minute (default: 15 minutes before the newest event)',
      )
      .option('--until <time>', 'window end for --per-minute (default: the newest event)'),
  ).action(async (opts: StatsOptions) => {
    process.exitCode = await statsCommand(opts);
  });

  journalOption(
    journal
      .command('prune')
      .description(
        'delete whole terminal rooms that ended longer ago than --older-than; never a live room (a writer: not while pdctl serve runs)',
      )
      .requiredOption('--older-than <age>', 'e.g. 7d, 12h')
      .option(
        '--chunk <rooms>',
        'rooms per transaction, so readers of the journal are never blocked long',
        '500',
      )
      .option('--dry-run', 'count what would be deleted, change nothing'),
  ).action(async (opts: PruneOptions) => {
    process.exitCode = await pruneCommand(opts);
  });

  journalOption(
    journal
      .command('synth')
      .description(
        'write a realistic synthetic journal through the real append path, for trying queries and benchmarks',
      )
      .requiredOption('--rooms <n>', 'number of requests to simulate')
      .option('--seed <n>', 'random seed; the same seed gives the same rooms', '1')
      .option('--span <duration>', 'time span the rooms arrive over', '1h')
      .option('--end <time>', 'when the span ends; rooms still running then stay in flight', 'now')
      .option('--prefill <ids>', 'prefill engine ids', 'p0,p1')
      .option('--decode <ids>', 'decode engine ids', 'd0,d1')
      .option('--incidents <n>', 'engine stalls of 15-30 s, with the rooms they fail', '1')
      .option('--durability <level>', 'process or power (see README: Durability)', 'power'),
  ).action(async (opts: SynthOptions) => {
    process.exitCode = await synthCommand(opts);
  });

  journalOption(
    journal
      .command('backup')
      .description(
        'copy the journal consistently, even while pdctl is writing it (plain cp of a live WAL database is not safe)',
      )
      .requiredOption('--to <file>', 'where to write the copy')
      .option('--force', 'overwrite --to if it exists'),
  ).action(async (opts: BackupOptions) => {
    process.exitCode = await backupCommand(opts);
  });

  journalOption(
    journal
      .command('migrate')
      .description('upgrade a journal written by an older pdctl to this schema, in place'),
  ).action(async (opts: CommonOptions) => {
    process.exitCode = await migrateCommand(opts);
  });
}
