/**
 * A throwaway PostgreSQL cluster in a temp directory, listening on a loopback port: what the
 * tests, the `control-plane-failover` drill and `npm run bench:journal -- --backend postgres` use
 * when no server is named. It needs
 * the server binaries (Debian: `apt-get install postgresql`, which puts them in
 * /usr/lib/postgresql/<version>/bin). initdb refuses to run as root, so as root the cluster
 * belongs to the `postgres` user that package creates.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort } from '../../net.ts';

export interface PgCluster {
  /** Superuser URL of the `postgres` database, e.g. postgres://postgres@127.0.0.1:5433/postgres */
  url: string;
  port: number;
  dir: string;
  stop(): void;
}

/** The directory holding initdb and pg_ctl, or null when PostgreSQL is not installed. */
export function findPgBin(): string | null {
  const onPath = spawnSync('sh', ['-c', 'command -v pg_ctl'], { encoding: 'utf8' });
  const candidates: string[] = [];
  if (onPath.status === 0) candidates.push(onPath.stdout.trim().replace(/\/pg_ctl$/, ''));
  const debian = '/usr/lib/postgresql';
  if (existsSync(debian)) {
    const versions = readdirSync(debian).sort((a, b) => Number(b) - Number(a));
    for (const v of versions) candidates.push(join(debian, v, 'bin'));
  }
  return (
    candidates.find((d) => existsSync(join(d, 'initdb')) && existsSync(join(d, 'pg_ctl'))) ?? null
  );
}

/**
 * Starts a cluster. `fast` turns fsync off (tests: a crash of the test machine loses nothing
 * worth keeping); benchmarks leave it on, so commits cost what they cost in production.
 */
export async function startPgCluster(opts: { fast?: boolean } = {}): Promise<PgCluster> {
  const bin = findPgBin();
  if (bin === null) {
    throw new Error(
      'PostgreSQL is not installed (no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin): apt-get install postgresql, or name a server with PDCTL_TEST_POSTGRES',
    );
  }
  const dir = mkdtempSync(join(tmpdir(), 'pdctl-pg-'));
  const asRoot = process.getuid?.() === 0;
  const run = runner(bin);
  if (asRoot) {
    const uid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim());
    const gid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim());
    chownSync(dir, uid, gid);
  }
  const data = join(dir, 'data');
  const port = await freePort();
  try {
    run('initdb', ['-D', data, '-A', 'trust', '-U', 'postgres', '-E', 'UTF8', '--no-sync']);
    const settings = [
      `-k ${dir}`,
      `-p ${port}`,
      '-c listen_addresses=127.0.0.1',
      '-c max_connections=200',
      ...(opts.fast ? ['-c fsync=off', '-c full_page_writes=off'] : []),
    ];
    run('pg_ctl', ['-D', data, '-l', join(dir, 'log'), '-o', settings.join(' '), '-w', 'start']);
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    const e = err as { stderr?: Buffer; message: string };
    throw new Error(
      `could not start PostgreSQL in ${dir}: ${e.stderr?.toString().trim() || e.message}`,
    );
  }
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    port,
    dir,
    stop: () => stopPgCluster(dir),
  };
}

/** Runs a server program, as `postgres` when this process is root (initdb refuses root). */
function runner(bin: string): (cmd: string, args: string[]) => void {
  const asRoot = process.getuid?.() === 0;
  return (cmd, args) => {
    const [file, argv] = asRoot
      ? ['runuser', ['-u', 'postgres', '--', join(bin, cmd), ...args]]
      : [join(bin, cmd), args];
    execFileSync(file, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  };
}

/** Stops the cluster `startPgCluster` made in `dir` and removes it. */
export function stopPgCluster(dir: string): void {
  const bin = findPgBin();
  if (bin !== null) {
    try {
      runner(bin)('pg_ctl', ['-D', join(dir, 'data'), '-m', 'immediate', '-w', 'stop']);
    } catch {
      // already gone
    }
  }
  rmSync(dir, { recursive: true, force: true });
}

/**
 * Creates a database on the server `adminUrl` points at (the user needs CREATEDB) and returns
 * its URL.
 */
export async function createDatabase(adminUrl: string, name: string): Promise<string> {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(name)) throw new Error(`bad database name ${name}`);
  const c = new pg.Client({ connectionString: adminUrl });
  await c.connect();
  try {
    await c.query(`CREATE DATABASE ${name}`);
  } finally {
    await c.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  return url.toString();
}
