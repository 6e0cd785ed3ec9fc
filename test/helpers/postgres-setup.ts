/**
 * vitest global setup: one PostgreSQL server for the whole run, for the tests of the PostgreSQL
 * journal. PDCTL_TEST_POSTGRES names an existing server (a superuser URL); otherwise a throwaway
 * cluster starts in a temp directory on a loopback port (scripts/pg-cluster.ts) and stops at the
 * end. Without PostgreSQL installed the tests that need it skip, loudly (test/helpers/postgres.ts).
 */
import type { TestProject } from 'vitest/node';
import { findPgBin, type PgCluster, startPgCluster } from '../../src/journal/postgres/cluster.ts';

declare module 'vitest' {
  export interface ProvidedContext {
    /** A superuser URL of the test server, or null when there is none. */
    pgAdminUrl: string | null;
    /** Why there is none. */
    pgMissing: string | null;
  }
}

let cluster: PgCluster | null = null;

export async function setup(project: TestProject): Promise<void> {
  const named = process.env.PDCTL_TEST_POSTGRES;
  if (named) {
    project.provide('pgAdminUrl', named);
    project.provide('pgMissing', null);
    return;
  }
  if (findPgBin() === null) {
    project.provide('pgAdminUrl', null);
    project.provide(
      'pgMissing',
      'PostgreSQL is not installed (apt-get install postgresql, or set PDCTL_TEST_POSTGRES to a superuser URL)',
    );
    return;
  }
  try {
    cluster = await startPgCluster({ fast: true });
    project.provide('pgAdminUrl', cluster.url);
    project.provide('pgMissing', null);
  } catch (err) {
    project.provide('pgAdminUrl', null);
    project.provide('pgMissing', (err as Error).message);
  }
}

export function teardown(): void {
  cluster?.stop();
}
