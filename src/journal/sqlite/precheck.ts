/**
 * The checks a journal file passes before a writer opens it, made without writing a byte of it.
 *
 * A read-write connection is not enough for that: SQLite replays a `-wal` left by a crash into
 * its index when it opens, and whoever closes the last connection checkpoints the WAL into the
 * main file and deletes it — so refusing a damaged journal after opening it read-write would
 * destroy the evidence an on-call engineer needs. The checks therefore read a private view: a
 * hard link of the journal (the same bytes, opened read-only) beside a copy of its `-wal`, in a
 * private directory next to it. SQLite builds its own `-shm` there; the journal's own `-wal` and
 * `-shm` are never opened.
 */
import {
  accessSync,
  constants,
  copyFileSync,
  existsSync,
  linkSync,
  mkdtempSync,
  rmSync,
  statSync,
} from 'node:fs';
import { basename, dirname, join } from 'node:path';
import Database from 'better-sqlite3';
import { JournalError } from '../errors.ts';
import { headVersion, schemaVersion } from './migrate.ts';

/** Why a journal is refused, and how an on-call engineer gets at what it holds. */
function recoveryAdvice(path: string): string {
  return `the file, its -wal and its -shm were left exactly as they were. To get at what it holds: \`pdctl journal backup --journal ${path} --to COPY.db\` (or \`pdctl journal export\`) copies what SQLite can still read; \`sqlite3 ${path} .recover > recovered.sql\` salvages rows from damaged pages (run it on a copy of all three files). Then move the journal aside (all three files) and start pdctl serve, which makes a new one`;
}

/**
 * SQLite's `quick_check` (every page read once, without integrity_check's index cross-checks:
 * docs/journal.md, "Durability", has its cost): null when the file is whole, else what is wrong.
 */
export function quickCheck(db: Database.Database): string | null {
  let problems: string[];
  try {
    problems = (
      db.pragma('quick_check(5)', { simple: false }) as Array<{ quick_check: string }>
    ).map((r) => r.quick_check);
  } catch (err) {
    return `it is damaged or is not a SQLite database: ${(err as { code?: string }).code ?? 'error'}: ${(err as Error).message}`;
  }
  if (problems.length === 1 && problems[0] === 'ok') return null;
  return problems
    .join('; ')
    .replace(/\s*\n\s*/g, ' ')
    .slice(0, 600);
}

/** A writer needs the journal and its directory writable; said before anything is opened. */
export function checkWritable(path: string): void {
  for (const [what, p] of [
    ['the journal', path],
    ['its directory', dirname(path)],
  ] as const) {
    if (!existsSync(p)) continue;
    try {
      accessSync(p, constants.W_OK);
    } catch (err) {
      throw new JournalError(
        'JOURNAL_READ_ONLY',
        `${path} cannot be written: ${what} is not writable (${(err as NodeJS.ErrnoException).code}: a read-only file or filesystem, or an immutable file — lsattr shows the i flag); a writer (pdctl serve, journal prune/migrate) needs it writable — fix the permissions or pass --data-dir on a writable disk. Read commands (pdctl rooms, journal verify) work on it as it is`,
        { cause: err },
      );
    }
  }
}

/**
 * Refuses an empty file, a damaged one, a file that is not a pdctl journal and a journal of a
 * newer schema — each without changing the file or its `-wal`/`-shm`. `emptyIsNew`: a 0-byte
 * file is to become a journal (`pdctl journal migrate` alone asks for that). `scan`: SQLite's
 * `quick_check` of every page too; without it, only what opening and reading the schema find
 * (the control plane then scans after its start: `quickCheck` in a thread of its own).
 */
export function checkBeforeWriting(path: string, emptyIsNew = false, scan = true): void {
  if (!existsSync(path)) return;
  checkWritable(path);
  if (statSync(path).size === 0) {
    if (emptyIsNew) return;
    throw new JournalError(
      'JOURNAL_CORRUPT',
      `${path} is empty (0 bytes): not a pdctl journal, and it was left as it is (the same rule for pdctl serve and every read command). If the journal was lost, look for a backup; to start a new journal in its place, remove the file, or run \`pdctl journal migrate --journal ${path}\``,
    );
  }
  const dir = mkdtempSync(join(dirname(path), `.${basename(path)}.check-`));
  try {
    const view = join(dir, 'journal.db');
    try {
      linkSync(path, view);
    } catch {
      // No hard link here (a filesystem without them): the same check on a full copy.
      copyFileSync(path, view);
    }
    if (existsSync(`${path}-wal`)) copyFileSync(`${path}-wal`, `${view}-wal`);
    checkView(view, path, scan);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function checkView(view: string, path: string, scan: boolean): void {
  let db: Database.Database;
  try {
    db = new Database(view, { readonly: true, fileMustExist: true });
  } catch (err) {
    throw new JournalError(
      'JOURNAL_CORRUPT',
      `${path} cannot be opened by SQLite (${(err as Error).message}); ${recoveryAdvice(path)}`,
      { cause: err },
    );
  }
  try {
    if (scan) {
      const failed = quickCheck(db);
      if (failed !== null)
        throw new JournalError(
          'JOURNAL_CORRUPT',
          `${path} failed SQLite's quick_check (${failed}), so nothing was written to it; ${recoveryAdvice(path)}`,
        );
    }
    let version: number | null;
    try {
      version = schemaVersion(db);
    } catch (err) {
      throw new JournalError(
        'JOURNAL_CORRUPT',
        `${path} is damaged or is not a SQLite database (${(err as { code?: string }).code ?? 'error'}: ${(err as Error).message}), so nothing was written to it; ${recoveryAdvice(path)}`,
        { cause: err },
      );
    }
    if (version === null) {
      throw new JournalError(
        'JOURNAL_CORRUPT',
        `${path} is a SQLite database but not a pdctl journal (it has no schema_migrations table); it was not modified`,
      );
    }
    const head = headVersion();
    if (version > head) {
      throw new JournalError(
        'JOURNAL_VERSION_CONFLICT',
        `${path} has journal schema version ${version}, but this pdctl only knows up to ${head}; it was written by a newer pdctl — upgrade pdctl to read it (the file was not modified)`,
      );
    }
  } finally {
    db.close();
  }
}
