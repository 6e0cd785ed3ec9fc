/**
 * Opening a journal file: the checks that keep a wrong file untouched (missing, corrupt, not a
 * journal, newer schema) run before anything is written, then pragmas and migrations.
 */
import { existsSync, mkdirSync } from 'node:fs';
import { dirname } from 'node:path';
import Database from 'better-sqlite3';
import { JournalError } from '../errors.ts';
import { headVersion, migrate, schemaVersion } from './migrate.ts';

/**
 * `process`: synchronous=NORMAL in WAL mode; a committed event survives any process crash
 * (kill -9 included); a power cut may lose the last transactions but never corrupts the file.
 * `power`: synchronous=FULL; every commit is fsynced before it is acknowledged.
 */
export type Durability = 'process' | 'power';
export const DURABILITIES: readonly Durability[] = ['process', 'power'];
/**
 * `power`: with group commit one fsync covers a whole batch, the fsync runs on the writer thread,
 * and bench/journal.ts measures the throughput cost under load as small; the record of an
 * incident then survives the host losing power too. See README "Durability".
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
}

const CORRUPT_CODES = new Set(['SQLITE_CORRUPT', 'SQLITE_NOTADB']);

/** Maps SQLite's errors about a damaged file to JOURNAL_CORRUPT; others pass through. */
export function classifySqliteError(err: unknown, path: string): unknown {
  const code = (err as { code?: unknown })?.code;
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

export function openDatabase(opts: OpenDatabaseOptions): Database.Database {
  const { path } = opts;
  const readonly = opts.readonly ?? false;
  if (!existsSync(path)) {
    if (readonly || !opts.create) {
      throw new JournalError(
        'JOURNAL_NOT_FOUND',
        `no journal at ${path}; pass --journal PATH to name one (pdctl serve creates ./data/journal.db)`,
      );
    }
    mkdirSync(dirname(path), { recursive: true });
  }
  let db: Database.Database;
  try {
    db = new Database(path, { readonly, fileMustExist: readonly || !opts.create });
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
