/**
 * PostgreSQL schema migrations: the numbered SQL files in `migrations/postgres/`
 * (src/journal/migrations.ts), each in its own transaction. An advisory lock serializes two
 * control planes that start at once against a new database.
 */
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { JournalError } from '../errors.ts';
import { type Migration, migrationFailed, readMigrations } from '../migrations.ts';

/** `migrations/postgres/` at the package root, the same depth from src/ and dist/. */
export const PG_MIGRATIONS_DIR = fileURLToPath(
  new URL('../../../migrations/postgres/', import.meta.url),
);

/** Key of the advisory lock held while migrating ("pdctl mig"). */
const MIGRATION_LOCK = 0x7064_6d69;

export function pgMigrations(dir = PG_MIGRATIONS_DIR): Migration[] {
  return readMigrations(dir);
}

/** The schema version: 0 for a database without pdctl's tables, null for one with others. */
export async function pgSchemaVersion(c: pg.ClientBase): Promise<number | null> {
  const tables = (
    await c.query<{ name: string }>(
      `SELECT table_name AS name FROM information_schema.tables
       WHERE table_schema = current_schema() AND table_name IN ('schema_migrations', 'events', 'rooms')`,
    )
  ).rows.map((r) => r.name);
  if (tables.length === 0) return 0;
  if (!tables.includes('schema_migrations')) return null;
  const r = await c.query<{ v: number | null }>('SELECT max(version) AS v FROM schema_migrations');
  return r.rows[0]?.v ?? 0;
}

/**
 * Brings the schema to this build's head; refuses a database that is not a pdctl journal or was
 * written by a newer pdctl. Returns the versions applied.
 */
export async function pgMigrate(
  c: pg.ClientBase,
  where: string,
  migrations = pgMigrations(),
): Promise<number[]> {
  await c.query('SELECT pg_advisory_lock($1)', [MIGRATION_LOCK]);
  try {
    const current = await pgSchemaVersion(c);
    if (current === null) {
      throw new JournalError(
        'JOURNAL_CORRUPT',
        `${where} has tables named events or rooms but is not a pdctl journal; give pdctl a database (or schema) of its own`,
      );
    }
    if (current > migrations.length) {
      throw new JournalError(
        'JOURNAL_VERSION_CONFLICT',
        `${where} has journal schema ${current}, newer than this pdctl knows (${migrations.length}); run the pdctl that wrote it, or upgrade`,
      );
    }
    await c.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
      version    INTEGER PRIMARY KEY,
      name       TEXT    NOT NULL,
      applied_at BIGINT  NOT NULL
    )`);
    const applied: number[] = [];
    for (const m of migrations) {
      if (m.version <= current) continue;
      try {
        await c.query('BEGIN');
        await c.query(m.sql);
        await c.query(
          'INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)',
          [m.version, m.name, Date.now()],
        );
        await c.query('COMMIT');
      } catch (err) {
        await c.query('ROLLBACK').catch(() => {});
        throw migrationFailed(m, err);
      }
      applied.push(m.version);
    }
    return applied;
  } finally {
    await c.query('SELECT pg_advisory_unlock($1)', [MIGRATION_LOCK]).catch(() => {});
  }
}
