/**
 * Connections to a PostgreSQL journal: URL checks, the session settings every connection gets,
 * and PostgreSQL's errors as the journal's coded errors.
 */
import pg from 'pg';
import { JournalError } from '../errors.ts';

/** Whether `--journal` names a PostgreSQL journal rather than a SQLite file. */
export function isPostgresUrl(value: string): boolean {
  return /^postgres(ql)?:\/\//i.test(value);
}

/** The URL without its password, for logs and messages. */
export function redactUrl(url: string): string {
  try {
    const u = new URL(url);
    if (u.password) u.password = '***';
    return u.toString();
  } catch {
    return '(unparsable PostgreSQL URL)';
  }
}

/** Checks a journal URL; throws a message that says what is wrong with it. */
export function checkPostgresUrl(url: string): void {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    throw new JournalError(
      'JOURNAL_BAD_QUERY',
      `"${redactUrl(url)}" is not a URL; a PostgreSQL journal is named like postgres://user:password@host:5432/database`,
    );
  }
  if (u.pathname.length <= 1) {
    throw new JournalError(
      'JOURNAL_BAD_QUERY',
      `${redactUrl(url)} names no database; add one: postgres://user@host:5432/pdctl`,
    );
  }
}

/** int8 (seq, times, counts) as JS numbers: every value the journal stores is a safe integer. */
const types = {
  getTypeParser(oid: number, format?: string) {
    if (oid === 20) return (v: string) => Number(v);
    return pg.types.getTypeParser(oid, format as 'text');
  },
};

export interface SessionOptions {
  url: string;
  /** Shown in pg_stat_activity, so a DBA sees what each session is. */
  applicationName: string;
  connectTimeoutMs?: number;
}

export function clientConfig(o: SessionOptions): pg.ClientConfig {
  return {
    connectionString: o.url,
    application_name: o.applicationName,
    connectionTimeoutMillis: o.connectTimeoutMs ?? 5000,
    keepAlive: true,
    types,
  };
}

export async function connectClient(o: SessionOptions): Promise<pg.Client> {
  const client = new pg.Client(clientConfig(o));
  // A connection that dies while idle emits 'error'; unheard, that would end the process. The
  // next query on it fails, and whoever issued it decides (reconnect, fail the append).
  client.on('error', () => {});
  try {
    await client.connect();
  } catch (err) {
    await client.end().catch(() => {});
    throw classifyPgError(err, o.url);
  }
  return client;
}

/** PostgreSQL's (and the socket's) errors as the journal's codes, with a message that says what to do. */
export function classifyPgError(err: unknown, url: string): JournalError {
  if (err instanceof JournalError) return err;
  const e = err as { code?: string; message?: string };
  const where = redactUrl(url);
  const message = e.message ?? String(err);
  switch (e.code) {
    case 'ECONNREFUSED':
    case 'ENOTFOUND':
    case 'EHOSTUNREACH':
    case 'ETIMEDOUT':
    case 'ECONNRESET':
    case '57P01': // admin_shutdown
    case '57P02': // crash_shutdown
    case '57P03': // cannot_connect_now
    case '08000':
    case '08001':
    case '08003':
    case '08006':
      return new JournalError(
        'JOURNAL_UNREACHABLE',
        `cannot reach the journal at ${where}: ${message}; check that PostgreSQL runs there and the URL is right`,
        { cause: err },
      );
    case '28P01':
    case '28000':
      return new JournalError(
        'JOURNAL_UNREACHABLE',
        `the journal at ${where} refused the login: ${message}; check the user and password in the URL`,
        { cause: err },
      );
    case '3D000':
      return new JournalError(
        'JOURNAL_NOT_FOUND',
        `${message} at ${where}; create it first (createdb, or CREATE DATABASE)`,
        { cause: err },
      );
    case '25006':
      return new JournalError(
        'JOURNAL_READ_ONLY',
        `the journal at ${where} is read-only (a hot standby?): ${message}; point --journal at the primary`,
        { cause: err },
      );
    case '53100':
      return new JournalError(
        'JOURNAL_WRITE_FAILED',
        `the journal's server is out of disk: ${message}`,
        { cause: err },
      );
    default:
      if (/timeout|terminat|Connection terminated|not queryable/i.test(message)) {
        return new JournalError('JOURNAL_UNREACHABLE', `lost the journal at ${where}: ${message}`, {
          cause: err,
        });
      }
      return new JournalError('JOURNAL_WRITE_FAILED', `journal at ${where}: ${message}`, {
        cause: err,
      });
  }
}
