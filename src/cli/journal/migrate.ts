/** `pdctl journal migrate`: upgrade an older journal in place. */
import { headVersion, schemaVersion } from '../../journal/sqlite/migrate.ts';
import { openDatabase } from '../../journal/sqlite/open.ts';
import { acquireWriterLock } from '../../journal/sqlite/writer-lock.ts';
import { type CommonOptions, EXIT, print } from '../context.ts';

export async function migrateCommand(opts: CommonOptions): Promise<number> {
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
