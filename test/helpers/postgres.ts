/**
 * PostgreSQL for tests: a fresh database per journal on the run's server (postgres-setup.ts).
 * Where there is no server the tests are skipped with a note, unless PDCTL_REQUIRE_TOOLS names
 * `postgres` (CI does), where its absence fails the run.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { afterAll, inject } from 'vitest';
import { createDatabase } from '../../src/journal/postgres/cluster.ts';
import { requireTool } from './tools.ts';

const adminUrl = inject('pgAdminUrl');

/**
 * Declares the "is installed" test and says whether tests that need PostgreSQL can run.
 * Call it at the top level of a test file.
 */
export function havePostgres(): boolean {
  return requireTool('postgres', adminUrl, inject('pgMissing') ?? 'apt-get install postgresql');
}

/** The test server's superuser URL (null without one). */
export function pgAdminUrl(): string | null {
  return adminUrl;
}

const created: string[] = [];
let cleanupRegistered = false;

/** A new empty database on the test server; its URL. Dropped when the test file ends. */
export async function freshDatabase(): Promise<string> {
  if (adminUrl === null) throw new Error('no PostgreSQL server for tests');
  const name = `pdctl_t_${randomBytes(6).toString('hex')}`;
  const url = await createDatabase(adminUrl, name);
  created.push(name);
  if (!cleanupRegistered) {
    cleanupRegistered = true;
    afterAll(async () => {
      const c = new pg.Client({ connectionString: adminUrl });
      await c.connect();
      try {
        for (const db of created.splice(0)) {
          await c.query(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`);
        }
      } finally {
        await c.end();
      }
    });
  }
  return url;
}
