/**
 * Schema migrations of every backend: numbered SQL files (`0001_initial.sql`, …) in one folder per
 * backend (`migrations/` for SQLite, `migrations/postgres/`), applied in order, one transaction
 * each. This module reads them; each backend applies them.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { JournalError } from './errors.ts';

export interface Migration {
  version: number;
  name: string;
  sql: string;
  /**
   * The file says `-- checkpoints: kept`: every event reads back after it as before (same
   * columns, same values), so a state checkpoint folded from them stays true. Any other
   * migration makes the next start ignore the checkpoint and fold the whole journal once.
   */
  keepsCheckpoints: boolean;
}

const KEEPS_CHECKPOINTS = /^-- checkpoints: kept\b/m;

/** The migrations in `dir`, in order; throws when their numbers have a gap. */
export function readMigrations(dir: string): Migration[] {
  const list: Migration[] = [];
  for (const file of readdirSync(dir).sort()) {
    const m = /^(\d{4})_([a-z0-9_]+)\.sql$/.exec(file);
    if (!m) continue;
    const sql = readFileSync(`${dir}/${file}`, 'utf8');
    list.push({
      version: Number(m[1]),
      name: m[2] as string,
      sql,
      keepsCheckpoints: KEEPS_CHECKPOINTS.test(sql),
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
  return list;
}

/** The message of a migration that failed and was rolled back. */
export function migrationFailed(m: Migration, err: unknown): JournalError {
  return new JournalError(
    'JOURNAL_MIGRATION_FAILED',
    `migration ${String(m.version).padStart(4, '0')}_${m.name} failed and was rolled back: ${(err as Error).message}`,
    { cause: err },
  );
}

/**
 * The first of `migrations` applied after schema `from` (up to `to`) that does not keep state
 * checkpoints, as `0008_name`; null when all of them do (or none ran).
 */
export function checkpointBreakingMigration(
  migrations: readonly Migration[],
  from: number,
  to: number,
): string | null {
  const m = migrations.find((m) => m.version > from && m.version <= to && !m.keepsCheckpoints);
  return m ? `${String(m.version).padStart(4, '0')}_${m.name}` : null;
}
