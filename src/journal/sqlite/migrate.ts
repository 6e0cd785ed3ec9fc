/** Schema migrations: numbered SQL files in `migrations/`, applied in order, one transaction each. */
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type Database from 'better-sqlite3';
import { JournalError } from '../errors.ts';

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

/** `migrations/` at the package root; the same depth from `src/journal/sqlite` and `dist/journal/sqlite`. */
export const MIGRATIONS_DIR = fileURLToPath(new URL('../../../migrations/', import.meta.url));

let cached: Migration[] | null = null;

export function loadMigrations(dir: string = MIGRATIONS_DIR): Migration[] {
  if (dir === MIGRATIONS_DIR && cached) return cached;
  const list: Migration[] = [];
  for (const file of readdirSync(dir).sort()) {
    const m = /^(\d{4})_([a-z0-9_]+)\.sql$/.exec(file);
    if (!m) continue;
    list.push({
      version: Number(m[1]),
      name: m[2] as string,
      sql: readFileSync(`${dir}/${file}`, 'utf8'),
    });
  }
  list.forEach((m, i) => {
    if (m.version !== i + 1) {
      throw new JournalError(
        'JOURNAL_MIGRATION_FAILED',
        `migrations in ${dir} must be numbered 0001, 0002, … without gaps; found ${m.version} at position ${i + 1}`,
      );
    }
  });
  if (dir === MIGRATIONS_DIR) cached = list;
  return list;
}

/** The newest schema version this build of pdctl knows. */
export function headVersion(): number {
  return loadMigrations().length;
}

/** The journal's schema version: 0 for an empty database, null if it is not a pdctl journal. */
export function schemaVersion(db: Database.Database): number | null {
  const tables = db
    .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    .pluck()
    .all() as string[];
  if (tables.length === 0) return 0;
  if (!tables.includes('schema_migrations')) return null;
  const v = db.prepare('SELECT max(version) FROM schema_migrations').pluck().get() as number | null;
  return v ?? 0;
}

/** Applies every pending migration; returns the versions applied. */
export function migrate(db: Database.Database, migrations = loadMigrations()): number[] {
  db.exec(`CREATE TABLE IF NOT EXISTS schema_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
  )`);
  const current = schemaVersion(db) ?? 0;
  const applied: number[] = [];
  const record = db.prepare(
    'INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)',
  );
  for (const m of migrations) {
    if (m.version <= current) continue;
    try {
      db.transaction(() => {
        db.exec(m.sql);
        record.run(m.version, m.name, Date.now());
      }).immediate();
    } catch (err) {
      throw new JournalError(
        'JOURNAL_MIGRATION_FAILED',
        `migration ${String(m.version).padStart(4, '0')}_${m.name} failed and was rolled back: ${(err as Error).message}`,
        { cause: err },
      );
    }
    applied.push(m.version);
  }
  return applied;
}
