/** `pdctl journal backup`: a consistent copy, safe while pdctl writes. */
import { statSync } from 'node:fs';
import { isPostgresJournal } from '../../app/journal.ts';
import { UsageError } from '../../errors.ts';
import { openDatabase } from '../../journal/sqlite/open.ts';
import { type CommonOptions, EXIT, note, print, printJson } from '../context.ts';
import { writeNewFile } from './new-file.ts';

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
  const db = openDatabase({ path: opts.journal, readonly: true, allowOlder: true });
  const started = performance.now();
  let lastNote = started;
  try {
    // Written in a private directory and linked into place when whole: an interrupted backup
    // never leaves a file that looks like a usable journal (new-file.ts).
    await writeNewFile(opts.to, { force: opts.force, journal: opts.journal }, async (tmp) => {
      await db.backup(tmp, {
        progress: ({ totalPages, remainingPages }) => {
          const t = performance.now();
          if (t - lastNote > 1000) {
            lastNote = t;
            note(`backup: ${totalPages - remainingPages}/${totalPages} pages`);
          }
          return 1000;
        },
      });
    });
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
