/**
 * Adding a tenant, rotating its key, revoking it: checked against the book, written as `tenant.*`
 * events. The same steps whether a serving control plane runs them (its admin routes) or the CLI
 * does on a journal no control plane is writing (`pdctl tenants … --journal`).
 */
import { codedErrors } from '../errors.ts';
import { BANDS, type EventInput } from '../room/events.ts';
import { isValidId } from '../room/ids.ts';
import type { Band, TenantBook } from './book.ts';
import { keyHash, keyIdOf, newTenantKey } from './keys.ts';

export class TenantError extends codedErrors(
  'TenantError',
  ['TENANT_INVALID', 'TENANT_EXISTS', 'TENANT_NOT_FOUND', 'TENANT_REVOKED'] as const,
  'TENANT_INVALID',
) {}

/** What of the journal tenants need: to append. */
export interface TenantJournal {
  append(event: EventInput): Promise<{ status: 'applied' | 'rejected' | 'duplicate' }>;
}

export interface TenantSpec {
  name: string;
  /** Default `interactive`. */
  band?: Band;
  maxConcurrency?: number;
  tokensPerMinute?: number;
}

/** A tenant and its key: the only time the key is seen. */
export interface IssuedKey {
  tenant: string;
  key: string;
  keyId: string;
}

function positive(what: string, n: number | undefined): void {
  if (n !== undefined && (!Number.isSafeInteger(n) || n < 1)) {
    throw new TenantError(
      'TENANT_INVALID',
      `${what} must be a whole number of at least 1, got ${n}`,
    );
  }
}

function live(book: TenantBook, name: string) {
  const t = book.get(name);
  if (!t) {
    const known = book.list().map((x) => x.name);
    throw new TenantError(
      'TENANT_NOT_FOUND',
      `no tenant ${name}${known.length > 0 ? `; tenants: ${known.join(', ')}` : '; there are none (pdctl tenants add NAME)'}`,
    );
  }
  if (t.revokedAt !== null) {
    throw new TenantError(
      'TENANT_REVOKED',
      `tenant ${name} was revoked at ${new Date(t.revokedAt).toISOString()}`,
    );
  }
  return t;
}

function issued(tenant: string): IssuedKey & { keyHash: string } {
  const key = newTenantKey();
  const hash = keyHash(key);
  return { tenant, key, keyHash: hash, keyId: keyIdOf(hash) };
}

export async function addTenant(
  journal: TenantJournal,
  book: TenantBook,
  spec: TenantSpec,
  source: string,
): Promise<IssuedKey> {
  const { name } = spec;
  if (!isValidId(name)) {
    throw new TenantError(
      'TENANT_INVALID',
      `a tenant's name is a letter or digit, then up to 127 letters, digits or . _ : @ / -; got ${JSON.stringify(name.slice(0, 200))}`,
    );
  }
  const band = spec.band ?? 'interactive';
  if (!(BANDS as readonly string[]).includes(band)) {
    throw new TenantError('TENANT_INVALID', `band must be ${BANDS.join(' or ')}, got ${band}`);
  }
  positive('max concurrency', spec.maxConcurrency);
  positive('tokens per minute', spec.tokensPerMinute);
  const had = book.get(name);
  if (had) {
    throw new TenantError(
      'TENANT_EXISTS',
      had.revokedAt === null
        ? `tenant ${name} exists (key ${had.keyId}); \`pdctl tenants rotate ${name}\` gives it a new key`
        : `tenant ${name} was revoked; a name is not given again — choose another`,
    );
  }
  const k = issued(name);
  const res = await journal.append({
    type: 'tenant.added',
    source,
    // One add per name, ever: two at once (two operators) store one, and the other is told.
    eventId: `tenant:${name}:added`,
    data: {
      tenant: name,
      band,
      ...(spec.maxConcurrency !== undefined ? { maxConcurrency: spec.maxConcurrency } : {}),
      ...(spec.tokensPerMinute !== undefined ? { tokensPerMinute: spec.tokensPerMinute } : {}),
      keyHash: k.keyHash,
      keyId: k.keyId,
    },
  });
  if (res.status !== 'applied') {
    throw new TenantError('TENANT_EXISTS', `tenant ${name} was added by someone else meanwhile`);
  }
  return { tenant: name, key: k.key, keyId: k.keyId };
}

export async function rotateKey(
  journal: TenantJournal,
  book: TenantBook,
  name: string,
  source: string,
): Promise<IssuedKey> {
  live(book, name);
  const k = issued(name);
  await journal.append({
    type: 'tenant.key_rotated',
    source,
    data: { tenant: name, keyHash: k.keyHash, keyId: k.keyId },
  });
  return { tenant: name, key: k.key, keyId: k.keyId };
}

export async function revokeTenant(
  journal: TenantJournal,
  book: TenantBook,
  name: string,
  source: string,
  reason?: string,
): Promise<void> {
  live(book, name);
  await journal.append({
    type: 'tenant.revoked',
    source,
    data: { tenant: name, ...(reason ? { reason: reason.slice(0, 500) } : {}) },
  });
}
