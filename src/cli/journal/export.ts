/**
 * `pdctl journal export`: an incident's window as a journal of its own — every room whose life
 * overlaps the window with all its events, and the events of no room (engines, recovery) inside
 * it — small enough to attach to a postmortem, and a journal every pdctl command reads.
 */
import { statSync } from 'node:fs';
import Database from 'better-sqlite3';
import { isPostgresJournal } from '../../app/journal.ts';
import { UsageError } from '../../errors.ts';
import { loadMigrations, migrate, schemaVersion } from '../../journal/sqlite/migrate.ts';
import { openDatabase } from '../../journal/sqlite/open.ts';
import { formatTs, parseTime } from '../../time.ts';
import { type CommonOptions, EXIT, note, print, printJson } from '../context.ts';
import { writeNewFile } from './new-file.ts';

export interface ExportOptions extends CommonOptions {
  since: string;
  until: string;
  to: string;
  force?: boolean;
}

export async function exportCommand(opts: ExportOptions): Promise<number> {
  if (isPostgresJournal(opts.journal)) {
    throw new UsageError(
      `journal export writes a SQLite file from a SQLite journal; this journal is in PostgreSQL: copy what you need with pg_dump, or query it with pdctl rooms / journal tail --journal URL`,
    );
  }
  const since = parseTime(opts.since);
  const until = parseTime(opts.until);
  if (until < since) {
    throw new UsageError(
      `--until (${formatTs(until)}) is before --since (${formatTs(since)}); the window is empty`,
    );
  }
  // The window's rows are read in one read transaction of the source (one snapshot, safe while
  // pdctl writes) into a new file of the source's schema: the time it takes follows the window,
  // not the history around it. Written in a private directory and linked into place when whole.
  let kept = { rooms: 0, events: 0 };
  await writeNewFile(opts.to, { force: opts.force, journal: opts.journal }, async (tmp) => {
    const source = openDatabase({ path: opts.journal, readonly: true, allowOlder: true });
    try {
      kept = copyWindow(source, tmp, since, until);
    } finally {
      source.close();
    }
  });
  const bytes = statSync(opts.to).size;
  const result = { from: opts.journal, to: opts.to, since, until, ...kept, bytes };
  if (opts.json) printJson(result);
  else {
    print(
      `exported ${kept.rooms} rooms and ${kept.events} events from ${formatTs(since)} to ${formatTs(until)} into ${opts.to} (${(bytes / 1024).toFixed(0)} KiB)`,
    );
    note(
      `read it like any journal: pdctl rooms --journal ${opts.to}; pdctl journal verify --journal ${opts.to}`,
    );
  }
  return EXIT.ok;
}

/** Rooms whose life overlaps [@since, @until], each part by an index of `rooms`. */
const KEPT_ROOMS = `SELECT room FROM rooms WHERE created_at BETWEEN @since AND @until
  UNION SELECT room FROM rooms WHERE terminal_at >= @since AND created_at <= @until
  UNION SELECT room FROM rooms WHERE terminal_at IS NULL AND created_at <= @until`;

/**
 * The rows of each table of the source to copy: a kept room's row and all its events, the events
 * of no room (or of a room the journal never had) by their own time, no readers' positions and no
 * state checkpoint, every row of the other small tables. Schema 7 keeps events in `event_rows`
 * (rooms as ids of `event_rooms`), schema 8 those of rooms that ended also in `room_packs`;
 * older schemas in the table `events`.
 */
function windowQuery(table: string): string | null {
  switch (table) {
    case 'rooms':
      return `SELECT * FROM rooms WHERE room IN (${KEPT_ROOMS})`;
    case 'events':
      return `SELECT * FROM events WHERE room IN (${KEPT_ROOMS})
        UNION ALL SELECT * FROM events e WHERE ts BETWEEN @since AND @until
          AND NOT EXISTS (SELECT 1 FROM rooms x WHERE x.room = e.room)
        ORDER BY seq`;
    case 'event_rows':
      return `SELECT * FROM event_rows WHERE room IN (SELECT id FROM event_rooms WHERE room IN (${KEPT_ROOMS}))
        UNION ALL SELECT * FROM event_rows e WHERE ts BETWEEN @since AND @until
          AND NOT EXISTS (SELECT 1 FROM event_rooms k JOIN rooms x ON x.room = k.room WHERE k.id = e.room)
        ORDER BY seq`;
    case 'room_packs':
      // Schema 8: a kept room's packed events (rooms keep their ids: a pack names its room's).
      return `SELECT * FROM room_packs WHERE room IN (SELECT id FROM rooms WHERE room IN (${KEPT_ROOMS}))`;
    case 'event_rooms':
      return null; // those the copied rows name, after them
    case 'consumers':
    case 'state_checkpoints':
      // Readers' positions, and the control plane's state folded from the whole history (not the
      // fold of the window: `journal verify` of the export would refuse it), mean nothing here.
      return null;
    default:
      return `SELECT * FROM "${table}"`;
  }
}

/** Writes at `path` a journal of the source's schema holding the window's rows; what it holds. */
function copyWindow(
  source: Database.Database,
  path: string,
  since: number,
  until: number,
): { rooms: number; events: number } {
  const db = new Database(path);
  try {
    const version = schemaVersion(source) ?? 0;
    migrate(db, loadMigrations().slice(0, version));
    const tables = db
      .prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
      )
      .pluck()
      .all() as string[];
    const window = { since, until };
    const copy = (table: string, rows: Iterable<unknown[]>) => {
      let insert: Database.Statement | null = null;
      for (const row of rows) {
        insert ??= db.prepare(`INSERT INTO "${table}" VALUES (${row.map(() => '?').join(', ')})`);
        insert.run(row);
      }
    };
    db.transaction(() => {
      source.transaction(() => {
        for (const table of tables) {
          // Empty first: the migrations' own rows (schema_migrations, event_names' first) come
          // from the source as they are there.
          db.prepare(`DELETE FROM "${table}"`).run();
          const sql = windowQuery(table);
          if (sql === null) continue;
          // Integers as BigInt: copied exactly, whatever their size.
          const read = source.prepare(sql).raw().safeIntegers();
          copy(
            table,
            read.iterate(...(sql.includes('@since') ? [window] : [])) as Iterable<unknown[]>,
          );
        }
        if (tables.includes('event_rooms')) {
          const named = db
            .prepare('SELECT DISTINCT room FROM event_rows WHERE room IS NOT NULL')
            .pluck()
            .all() as number[];
          const one = source.prepare('SELECT * FROM event_rooms WHERE id = ?').raw().safeIntegers();
          copy(
            'event_rooms',
            named.map((id) => one.get(id) as unknown[]),
          );
        }
        // Seqs stay what they were, and so does the high-water mark a writer would go on from.
        const marks = source
          .prepare('SELECT name, seq FROM sqlite_sequence')
          .raw()
          .safeIntegers()
          .all() as Array<[string, bigint]>;
        const mark = db.prepare('UPDATE sqlite_sequence SET seq = ? WHERE name = ?');
        const add = db.prepare('INSERT INTO sqlite_sequence (seq, name) VALUES (?, ?)');
        for (const [name, seq] of marks) if (mark.run(seq, name).changes === 0) add.run(seq, name);
      })();
    })();
    db.exec('VACUUM');
    return {
      rooms: db.prepare('SELECT count(*) FROM rooms').pluck().get() as number,
      events: db.prepare('SELECT count(*) FROM events').pluck().get() as number,
    };
  } finally {
    db.close();
  }
}
