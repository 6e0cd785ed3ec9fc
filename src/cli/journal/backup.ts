/** `pdctl journal backup`: a consistent copy, safe while pdctl writes. */
import { existsSync, renameSync, rmSync, statSync } from 'node:fs';
import { isPostgresJournal } from '../../app/journal.ts';
import { UsageError } from '../../errors.ts';
import { openDatabase } from '../../journal/sqlite/open.ts';
import { type CommonOptions, EXIT, note, print, printJson } from '../context.ts';

export interface BackupOptions extends CommonOptions {
  to: string;
  force?: boolean;
}

/** A consistent copy of a journal, safe while pdctl is writing it (SQLite's online backup). */
export async function backupCommand(opts: BackupOptions): Promise<number> {
  if (isPostgresJournal(opts.journal)) {
    throw new UsageError(
      `journal backup writes a SQLite file from a SQLite journal; this journal is in PostgreSQL: copy it with pg_dump (pg_dump -Fc 'URL' > journal.dump), or a base backup of the server`,
    );
  }
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
