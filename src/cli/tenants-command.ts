/**
 * `pdctl tenants add|list|rotate|revoke`: who may call the serving API. With `--url`, through a
 * serving control plane's admin routes (needs PDCTL_ADMIN_TOKEN when it has one); with
 * `--journal`, on a journal no control plane is writing. A key is printed once, alone on its line,
 * and kept nowhere: the journal holds its SHA-256.
 */
import type { Command } from 'commander';
import { openJournal, openJournalReader } from '../app/journal.ts';
import { UsageError } from '../errors.ts';
import { JournalError } from '../journal/errors.ts';
import { eachEvent } from '../journal/store.ts';
import { silentLogger } from '../log.ts';
import { BANDS } from '../room/events.ts';
import {
  addTenant,
  type IssuedKey,
  revokeTenant,
  rotateKey,
  TenantError,
  type TenantJournal,
  type TenantSpec,
} from '../tenants/admin.ts';
import { type Band, TENANT_EVENT_TYPES, type Tenant, TenantBook } from '../tenants/book.ts';
import { formatTs } from '../time.ts';
import { callServer, errorOf, reaching, readTarget } from './api-client.ts';
import { type CommonOptions, EXIT, note, print, printJson } from './context.ts';
import { renderTable } from './table.ts';

type TenantOptions = CommonOptions & { url?: string };

type Target = { url: string } | { journal: string };

/** The book of a journal file or database, folded from its `tenant.*` events. */
async function bookOf(reader: Parameters<typeof eachEvent>[0]): Promise<TenantBook> {
  const book = new TenantBook();
  await eachEvent(reader, { type: [...TENANT_EVENT_TYPES] }, (ev) => {
    book.apply(ev);
    return true;
  });
  return book;
}

/** Runs `fn` as the journal's writer; a control plane serving it is named, with what to do. */
async function onJournal<T>(
  path: string,
  fn: (journal: TenantJournal, book: TenantBook) => Promise<T>,
): Promise<T> {
  let journal: Awaited<ReturnType<typeof openJournal>>;
  try {
    journal = await openJournal({ path, log: silentLogger });
  } catch (err) {
    if (err instanceof JournalError && err.code === 'JOURNAL_BUSY')
      throw new UsageError(
        `${err.message}\na control plane serves this journal: run the command with --url (its HTTP API) instead`,
      );
    throw err;
  }
  try {
    return await fn(journal, await bookOf(journal));
  } finally {
    await journal.drain();
  }
}

/** A server's answer, or a usage error that says what it said. */
async function onServer<T>(url: string, path: string, body?: unknown): Promise<T> {
  const r = await callServer<T>(url, path, body === undefined ? {} : { method: 'POST', body });
  if (r.status === 404 && path === '/v1/tenants')
    throw new UsageError(`${url} has no tenant routes: is it a pdctl serve of this version?`);
  if (r.status < 200 || r.status > 299) throw new UsageError(errorOf(r.status, r.body));
  return r.body;
}

/** Tenant errors are the operator's input: a usage error (exit 2) with the same words. */
async function asUsage<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof TenantError) throw new UsageError(err.message);
    throw err;
  }
}

function showKey(o: TenantOptions, k: IssuedKey, what: string): void {
  if (o.json) printJson({ tenant: k.tenant, key: k.key });
  else print(k.key);
  note(`${what}; key ${k.keyId} is shown this once — the journal keeps only its hash`);
}

function count(flag: string, v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1)
    throw new UsageError(`${flag} must be a whole number of at least 1, got ${v}`);
  return n;
}

export function registerTenantsCommand(
  program: Command,
  journalOption: (c: Command) => Command,
): void {
  const tenants = program
    .command('tenants')
    .description(
      'who may call the serving API (/v1/completions, /v1/chat/completions, /v1/models): once a tenant exists, ' +
        'those routes need "Authorization: Bearer KEY" of a tenant that is not revoked. Kept in the journal as ' +
        'tenant.* events (the key as its SHA-256). With --url: through a running pdctl serve (PDCTL_ADMIN_TOKEN ' +
        'when it has one); with --journal: on a journal no control plane is writing.',
    );
  const withTarget = (c: Command) =>
    journalOption(c).option('--url <url>', 'a running pdctl serve (env PDCTL_URL)');

  withTarget(
    tenants
      .command('add')
      .description(
        'add a tenant and print its new key, alone on one line (--json: {"tenant", "key"})',
      )
      .argument(
        '<name>',
        "the tenant's name: a letter or digit, then up to 127 of letters, digits, . _ : @ / -",
      )
      .option('--band <band>', `its priority band: ${BANDS.join(' or ')}`, 'interactive')
      .option(
        '--max-concurrency <n>',
        'most of its requests in flight at once; one more is 429 tenant_concurrency_limit (default: no limit of its own)',
      )
      .option(
        '--tokens-per-minute <n>',
        'most prompt and completion tokens a minute; past them, 429 tenant_token_limit (default: no limit of its own)',
      ),
  ).action(
    async (
      name: string,
      o: TenantOptions & { band: string; maxConcurrency?: string; tokensPerMinute?: string },
      cmd: Command,
    ) => {
      if (!(BANDS as readonly string[]).includes(o.band))
        throw new UsageError(`--band must be ${BANDS.join(' or ')}, got ${o.band}`);
      const spec: TenantSpec = { name, band: o.band as Band };
      const mc = count('--max-concurrency', o.maxConcurrency);
      const tpm = count('--tokens-per-minute', o.tokensPerMinute);
      if (mc !== undefined) spec.maxConcurrency = mc;
      if (tpm !== undefined) spec.tokensPerMinute = tpm;
      const target: Target = readTarget(o, cmd);
      process.exitCode = await reaching('tenants add', async () => {
        const k =
          'url' in target
            ? await onServer<IssuedKey>(target.url, '/v1/tenants', spec)
            : await asUsage(() =>
                onJournal(target.journal, (j, b) => addTenant(j, b, spec, 'operator')),
              );
        showKey(o, k, `tenant ${k.tenant} (${spec.band}) added`);
        return EXIT.ok;
      });
    },
  );

  withTarget(
    tenants.command('list').description('every tenant ever added, revoked ones too; never a key'),
  ).action(async (o: TenantOptions, cmd: Command) => {
    const target: Target = readTarget(o, cmd);
    process.exitCode = await reaching('tenants list', async () => {
      let rows: Tenant[];
      if ('url' in target) {
        rows = (await onServer<{ tenants: Tenant[] }>(target.url, '/v1/tenants')).tenants;
      } else {
        const reader = openJournalReader(target.journal);
        try {
          rows = (await bookOf(reader)).list();
        } finally {
          reader.close();
        }
      }
      if (o.json) printJson(rows);
      else if (rows.length === 0)
        note('no tenants: the serving API is open (pdctl tenants add NAME)');
      else
        print(
          renderTable(rows, [
            { header: 'TENANT', value: (t) => t.name },
            { header: 'BAND', value: (t) => t.band },
            { header: 'MAX-CONCURRENCY', value: (t) => t.maxConcurrency, align: 'right' },
            { header: 'TOKENS/MIN', value: (t) => t.tokensPerMinute, align: 'right' },
            { header: 'KEY', value: (t) => t.keyId },
            { header: 'ADDED', value: (t) => formatTs(t.addedAt) },
            {
              header: 'STATE',
              value: (t) =>
                t.revokedAt !== null
                  ? `revoked ${formatTs(t.revokedAt)}`
                  : t.rotatedAt !== null
                    ? `live (key rotated ${formatTs(t.rotatedAt)})`
                    : 'live',
            },
          ]),
        );
      return EXIT.ok;
    });
  });

  withTarget(
    tenants
      .command('rotate')
      .description('give the tenant a new key and print it; the old one is refused from then on')
      .argument('<name>', 'the tenant'),
  ).action(async (name: string, o: TenantOptions, cmd: Command) => {
    const target: Target = readTarget(o, cmd);
    process.exitCode = await reaching('tenants rotate', async () => {
      const k =
        'url' in target
          ? await onServer<IssuedKey>(
              target.url,
              `/v1/tenants/${encodeURIComponent(name)}/rotate`,
              {},
            )
          : await asUsage(() =>
              onJournal(target.journal, (j, b) => rotateKey(j, b, name, 'operator')),
            );
      showKey(o, k, `tenant ${name}'s key rotated`);
      return EXIT.ok;
    });
  });

  withTarget(
    tenants
      .command('revoke')
      .description(
        'end the tenant: its key is refused from then on, and its name is not given again',
      )
      .argument('<name>', 'the tenant')
      .option('--reason <text>', 'journaled with tenant.revoked'),
  ).action(async (name: string, o: TenantOptions & { reason?: string }, cmd: Command) => {
    const target: Target = readTarget(o, cmd);
    process.exitCode = await reaching('tenants revoke', async () => {
      if ('url' in target)
        await onServer(target.url, `/v1/tenants/${encodeURIComponent(name)}/revoke`, {
          ...(o.reason ? { reason: o.reason } : {}),
        });
      else
        await asUsage(() =>
          onJournal(target.journal, (j, b) => revokeTenant(j, b, name, 'operator', o.reason)),
        );
      if (o.json) printJson({ tenant: name, revoked: true });
      else print(`tenant ${name} revoked: its key is refused from now on`);
      return EXIT.ok;
    });
  });
}
