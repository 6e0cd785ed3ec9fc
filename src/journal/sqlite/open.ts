/**
 * Opening a journal file: the checks that keep a wrong file untouched (missing, corrupt, not a
 * journal, newer schema) run before anything is written, then pragmas and migrations.
 */
import {
  accessSync,
  constants,
  copyFileSync,
  existsSync,
  mkdtempSync,
  rmSync,
  statSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import Database from 'better-sqlite3';
import { JournalError } from '../errors.ts';
import type { Durability } from '../store.ts';
import { headVersion, migrate, schemaVersion } from './migrate.ts';
import { checkBeforeWriting } from './precheck.ts';
import { makeJournalDir, makePrivate } from './privacy.ts';

/**
 * `power`: with group commit one fsync covers a whole batch, the fsync runs on the writer thread,
 * and bench/journal.ts measures the throughput cost under load as small; the record of an
 * incident then survives the host losing power too. See docs/journal.md, "Durability".
 */
export const DEFAULT_DURABILITY: Durability = 'power';

export interface OpenDatabaseOptions {
  path: string;
  /** Open for reading only; the file is never modified. */
  readonly?: boolean;
  /** Create the file (and its directory) when it does not exist. Default false. */
  create?: boolean;
  durability?: Durability;
  /** Read-only opens refuse an older schema (queries expect head) unless this is set. */
  allowOlder?: boolean;
  /** How long a statement waits for another writer's lock, in ms. Default 5000. */
  busyTimeoutMs?: number;
  /** A writer may make a 0-byte file a new journal (`pdctl journal migrate` only). Default false. */
  emptyIsNew?: boolean;
  /**
   * A writer checks the file first, without writing to it (precheck.ts). Default true; false for
   * a second connection to a journal this process already checked (the checkpointer's).
   */
  precheck?: boolean;
  /** The precheck reads every page (`quick_check`). Default true; false: the caller scans later. */
  scan?: boolean;
}

const CORRUPT_CODES = new Set(['SQLITE_CORRUPT', 'SQLITE_NOTADB']);

/**
 * Maps SQLite's errors about a damaged file to JOURNAL_CORRUPT and about an unwritable one to
 * JOURNAL_READ_ONLY; others pass through.
 */
export function classifySqliteError(err: unknown, path: string): unknown {
  const code = (err as { code?: unknown })?.code;
  if (typeof code === 'string' && code.startsWith('SQLITE_READONLY')) {
    return new JournalError(
      'JOURNAL_READ_ONLY',
      `${path} cannot be written (${code}: ${(err as Error).message}): a read-only file or filesystem; a writer (pdctl serve, journal prune/migrate) needs it writable — fix the permissions or pass --data-dir on a writable disk. Read commands (pdctl rooms, journal verify) work on it as it is`,
      { cause: err },
    );
  }
  if (typeof code === 'string' && (CORRUPT_CODES.has(code) || code.startsWith('SQLITE_CORRUPT'))) {
    return new JournalError(
      'JOURNAL_CORRUPT',
      `${path} is damaged or is not a SQLite database (${code}: ${(err as Error).message}); ` +
        'restore it from a backup or move it aside, and run `pdctl journal verify` on the copy',
      { cause: err },
    );
  }
  return err;
}

/**
 * SQLite cannot read a WAL-mode file on read-only media unless its -shm already exists (it must
 * create one). There, with no writer possible, a private copy is read instead: copied to a
 * temporary file, switched to rollback mode, opened read-only and unlinked at once (the open file
 * stays readable; nothing is left behind).
 */
function readableOnReadOnlyMedia(db: Database.Database, path: string): Database.Database {
  try {
    db.prepare('SELECT 1 FROM sqlite_master LIMIT 1').get();
    return db;
  } catch (err) {
    if ((err as { code?: string }).code !== 'SQLITE_CANTOPEN') throw err;
  }
  db.close();
  const dir = mkdtempSync(join(tmpdir(), 'pdctl-ro-'));
  const copy = join(dir, 'journal.db');
  try {
    copyFileSync(path, copy);
    const rw = new Database(copy, { fileMustExist: true });
    rw.pragma('journal_mode = DELETE');
    rw.close();
    return new Database(copy, { readonly: true, fileMustExist: true });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function writable(path: string): boolean {
  try {
    accessSync(path, constants.W_OK);
    accessSync(dirname(path), constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

export function openDatabase(opts: OpenDatabaseOptions): Database.Database {
  const { path } = opts;
  const readonly = opts.readonly ?? false;
  const created = !existsSync(path);
  if (created) {
    if (readonly || !opts.create) {
      throw new JournalError(
        'JOURNAL_NOT_FOUND',
        `no journal at ${path}; pass --journal PATH to name one (pdctl serve creates ./data/journal.db)`,
      );
    }
    makeJournalDir(path);
  }
  // A writer checks the file without writing to it first: a damaged or foreign journal is left
  // byte for byte as it was, its -wal and -shm too (precheck.ts).
  if (!readonly && opts.precheck !== false)
    checkBeforeWriting(path, opts.emptyIsNew ?? false, opts.scan ?? true);
  // A reader never turns an empty file into a journal (a writer may: `journal migrate`, which
  // reads it first as schema 0 with allowOlder, does).
  if (readonly && !opts.allowOlder && existsSync(path) && statSync(path).size === 0) {
    throw new JournalError(
      'JOURNAL_CORRUPT',
      `${path} is empty (0 bytes): not a pdctl journal, and it was left as it is; to make it a new journal, run \`pdctl journal migrate --journal ${path}\``,
    );
  }
  // A reader of a journal that has no -wal beside it (no writer is running) opens read-write
  // with every write refused: then SQLite removes the -wal and -shm it needs when the reader
  // closes, and a journal that was only read is left as it was found. A -wal already there is
  // a writer's (or a crashed one's): the reader opens read-only and leaves it alone.
  const queryOnly = readonly && !existsSync(`${path}-wal`) && writable(path);
  let db: Database.Database;
  try {
    db = new Database(path, {
      readonly: readonly && !queryOnly,
      fileMustExist: readonly || !opts.create,
    });
    if (created) makePrivate(path);
    if (queryOnly) db.pragma('query_only = 1');
    if (readonly && !queryOnly && !writable(path)) db = readableOnReadOnlyMedia(db, path);
  } catch (err) {
    throw new JournalError(
      'JOURNAL_NOT_FOUND',
      `cannot open journal ${path}: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
  try {
    db.pragma(`busy_timeout = ${opts.busyTimeoutMs ?? 5000}`);
    const version = schemaVersion(db);
    const head = headVersion();
    if (version === null) {
      throw new JournalError(
        'JOURNAL_CORRUPT',
        `${path} is a SQLite database but not a pdctl journal (it has no schema_migrations table); it was not modified`,
      );
    }
    if (version > head) {
      throw new JournalError(
        'JOURNAL_VERSION_CONFLICT',
        `${path} has journal schema version ${version}, but this pdctl only knows up to ${head}; ` +
          'it was written by a newer pdctl — upgrade pdctl to read it (the file was not modified)',
      );
    }
    if (readonly) {
      if (version < head && !opts.allowOlder) {
        throw new JournalError(
          'JOURNAL_VERSION_CONFLICT',
          `${path} has journal schema version ${version}, older than this pdctl's ${head}; ` +
            `upgrade it in place with \`pdctl journal migrate --journal ${path}\``,
        );
      }
      return db;
    }
    db.pragma('journal_mode = WAL');
    db.pragma(
      `synchronous = ${(opts.durability ?? DEFAULT_DURABILITY) === 'power' ? 'FULL' : 'NORMAL'}`,
    );
    db.pragma('cache_size = -65536');
    db.pragma('temp_store = MEMORY');
    migrate(db);
    return db;
  } catch (err) {
    db.close();
    throw classifySqliteError(err, path);
  }
}
