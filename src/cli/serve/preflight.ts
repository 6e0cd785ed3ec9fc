/**
 * What `pdctl serve` checks before it opens anything: an API open to the network by mistake, and
 * a taken HTTP port, are known at once.
 */
import { existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { isPostgresJournal, openJournalReader } from '../../app/journal.ts';
import { UsageError } from '../../errors.ts';
import { TENANT_EVENT_TYPES } from '../../tenants/book.ts';

/** 127.0.0.0/8, ::1 and localhost: only this machine reaches an API there. */
export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127(\.\d{1,3}){3}$/.test(host);
}

/** Whether the journal holds a tenant; false for one not made yet, or not readable now. */
async function hasTenants(journalPath: string): Promise<boolean> {
  if (!isPostgresJournal(journalPath) && !existsSync(journalPath)) return false;
  let reader: ReturnType<typeof openJournalReader> | null = null;
  try {
    reader = openJournalReader(journalPath);
    return (await reader.tail({ type: [...TENANT_EVENT_TYPES], limit: 1 })).length > 0;
  } catch {
    // Opening the journal for serving says what is wrong with it, and better than here.
    return true;
  } finally {
    reader?.close();
  }
}

/**
 * A serve the network reaches, with no tenant and no admin token, would run anyone's completions
 * and show anyone every room: refused unless `--allow-open` says it is meant.
 */
export async function notOpenByMistake(o: {
  host: string;
  journalPath: string;
  adminToken: string | null;
  allowOpen: boolean;
}): Promise<void> {
  if (o.allowOpen || o.adminToken !== null || isLoopbackHost(o.host)) return;
  if (await hasTenants(o.journalPath)) return;
  throw new UsageError(
    `--host ${o.host} is reachable from the network, and this stack has no tenant and no admin token: anyone who reaches it could run completions and read every room. Add a tenant (pdctl tenants add NAME --journal …) and set PDCTL_ADMIN_TOKEN, or pass --allow-open to serve it open on purpose`,
  );
}

/** Refuses a host and port another process listens on (port 0: any free one, always). */
export async function httpPortFree(host: string, port: number): Promise<void> {
  if (port === 0) return;
  const probe = createServer();
  await new Promise<void>((resolve, reject) => {
    probe.once('error', (err) =>
      reject(
        new UsageError(`cannot listen on ${host}:${port}: ${err.message}; pass another --port`),
      ),
    );
    probe.listen({ host, port, exclusive: true }, () => probe.close(() => resolve()));
  });
}
