/** `pdctl journal migrate`: upgrade an older journal in place. */
import { JournalError } from '../../journal/errors.ts';
import { connectClient, isPostgresUrl, redactUrl } from '../../journal/postgres/connect.ts';
import { readLeader } from '../../journal/postgres/leadership.ts';
import { pgMigrate, pgMigrations, pgSchemaVersion } from '../../journal/postgres/migrate.ts';
import { headVersion, schemaVersion } from '../../journal/sqlite/migrate.ts';
import { openDatabase } from '../../journal/sqlite/open.ts';
import { acquireWriterLock } from '../../journal/sqlite/writer-lock.ts';
import { type CommonOptions, EXIT, print } from '../context.ts';

export async function migrateCommand(opts: CommonOptions): Promise<number> {
  if (isPostgresUrl(opts.journal)) return migratePostgres(opts.journal);
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
    openDatabase({ path: opts.journal, durability: 'power', emptyIsNew: true }).close();
  } finally {
    lock.release();
  }
  print(`${opts.journal}: schema ${before} → ${head}`);
  return EXIT.ok;
}

/**
 * PostgreSQL: each pending migration in its own transaction, under the migration lock. Refused
 * while a control plane leads the journal (stop them first), as SQLite's writer lock refuses it.
 */
async function migratePostgres(url: string): Promise<number> {
  const where = redactUrl(url);
  const c = await connectClient({ url, applicationName: 'pdctl migrate' });
  try {
    const before = (await pgSchemaVersion(c)) ?? 0;
    const head = pgMigrations().length;
    if (before === head) {
      print(`${where} is at schema ${head}, the newest this pdctl knows; nothing to do`);
      return EXIT.ok;
    }
    if (before > 0) {
      const leader = await readLeader(c);
      if (leader.backendPid !== null && leader.leaseUntil >= leader.now) {
        throw new JournalError(
          'JOURNAL_BUSY',
          `${where} is led by ${leader.holder} (term ${leader.term}); stop every control plane on it before migrating`,
        );
      }
    }
    await pgMigrate(c, where);
    print(`${where}: schema ${before} → ${head}`);
    return EXIT.ok;
  } finally {
    await c.end();
  }
}
