/**
 * `pdctl journal export`: an incident's window as a journal of its own — every room whose life
 * overlaps the window with all its events, and the events of no room (engines, recovery) inside
 * it — small enough to attach to a postmortem, and a journal every pdctl command reads.
 */
import { statSync } from 'node:fs';
import Database from 'better-sqlite3';
import { isPostgresJournal } from '../../app/journal.ts';
import { UsageError } from '../../errors.ts';
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
  // A consistent copy first (safe while pdctl writes), then everything outside the window is
  // deleted from the copy; written in a private directory and linked into place when whole.
  let kept = { rooms: 0, events: 0 };
  await writeNewFile(opts.to, { force: opts.force, journal: opts.journal }, async (tmp) => {
    const source = openDatabase({ path: opts.journal, readonly: true, allowOlder: true });
    try {
      await source.backup(tmp);
    } finally {
      source.close();
    }
    kept = keepWindow(tmp, since, until);
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

/** Deletes from the copy at `path` everything outside [since, until]; what is left. */
function keepWindow(path: string, since: number, until: number): { rooms: number; events: number } {
  const db = new Database(path);
  try {
    const kept = db.transaction(() => {
      db.prepare(
        `CREATE TEMP TABLE keep AS SELECT room FROM rooms
         WHERE created_at <= @until AND (terminal_at IS NULL OR terminal_at >= @since)`,
      ).run({ since, until });
      // A room's events go with its room; events of no room (or of a room the journal never
      // had) go by their own time.
      db.prepare(
        `DELETE FROM events WHERE
           CASE WHEN room IS NOT NULL AND room IN (SELECT room FROM rooms)
             THEN room NOT IN (SELECT room FROM temp.keep)
             ELSE ts < @since OR ts > @until
           END`,
      ).run({ since, until });
      db.prepare('DELETE FROM rooms WHERE room NOT IN (SELECT room FROM temp.keep)').run();
      // Readers' positions in the source mean nothing here.
      db.prepare('DELETE FROM consumers').run();
      return {
        rooms: (db.prepare('SELECT count(*) AS n FROM rooms').get() as { n: number }).n,
        events: (db.prepare('SELECT count(*) AS n FROM events').get() as { n: number }).n,
      };
    })();
    db.exec('VACUUM');
    // Checkpointed and closed: the file alone is the whole journal (its -wal, if any, stays in
    // the private directory and goes with it).
    db.pragma('wal_checkpoint(TRUNCATE)');
    return kept;
  } finally {
    db.close();
  }
}
