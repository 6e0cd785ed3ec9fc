/** SQLite schema migrations: the numbered SQL files in `migrations/` (src/journal/migrations.ts). */
import { fileURLToPath } from 'node:url';
import type Database from 'better-sqlite3';
import { type Migration, migrationFailed, readMigrations } from '../migrations.ts';

/** `migrations/` at the package root; the same depth from `src/journal/sqlite` and `dist/journal/sqlite`. */
export const MIGRATIONS_DIR = fileURLToPath(new URL('../../../migrations/', import.meta.url));

export function loadMigrations(dir: string = MIGRATIONS_DIR): Migration[] {
  return readMigrations(dir);
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
  // A migration that rewrites a table of millions of rows keeps that statement's undo journal and
  // its sorts in temporary storage: on disk, not in memory (0009 on 203,843 packs: 0.31 GB of
  // memory with temp_store = MEMORY, 0.15 GB with FILE).
  const tempStore = db.pragma('temp_store', { simple: true }) as number;
  db.pragma('temp_store = FILE');
  try {
    for (const m of migrations) {
      if (m.version <= current) continue;
      try {
        db.transaction(() => {
          db.exec(m.sql);
          record.run(m.version, m.name, Date.now());
        }).immediate();
      } catch (err) {
        throw migrationFailed(m, err);
      }
      applied.push(m.version);
    }
  } finally {
    db.pragma(`temp_store = ${tempStore}`);
  }
  return applied;
}
