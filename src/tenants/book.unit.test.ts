import { describe, expect, it } from 'vitest';
import type { JournalEvent } from '../room/events.ts';
import { TenantBook } from './book.ts';
import { keyHash, keyIdOf, newTenantKey } from './keys.ts';

let seq = 0;
function ev(type: JournalEvent['type'], data: object, ts = 1000 + seq): JournalEvent {
  seq++;
  return {
    seq,
    type,
    room: null,
    engine: null,
    source: 'operator',
    eventId: `e${seq}`,
    ts,
    data,
  } as JournalEvent;
}

function added(tenant: string, key: string, band: 'interactive' | 'batch' = 'interactive') {
  const h = keyHash(key);
  return ev('tenant.added', { tenant, band, keyHash: h, keyId: keyIdOf(h) });
}

describe('the tenant book, folded from tenant.* events', () => {
  it('is open until a tenant is added, then takes only a live key', () => {
    const book = new TenantBook();
    expect(book.closed).toBe(false);
    const key = newTenantKey();
    expect(key).toMatch(/^pdk-[A-Za-z0-9_-]{43}$/);
    book.apply(added('acme', key, 'batch'));
    expect(book.closed).toBe(true);
    expect(book.authenticate(key)).toMatchObject({ name: 'acme', band: 'batch' });
    expect(book.authenticate(newTenantKey())).toBeNull();
    expect(book.authenticate('')).toBeNull();
  });

  it('a second add of a name changes nothing: the first key stays the one', () => {
    const book = new TenantBook();
    const first = newTenantKey();
    const second = newTenantKey();
    book.apply(added('acme', first));
    book.apply(added('acme', second, 'batch'));
    expect(book.authenticate(first)).toMatchObject({ name: 'acme', band: 'interactive' });
    expect(book.authenticate(second)).toBeNull();
    expect(book.list()).toHaveLength(1);
  });

  it('a rotation refuses the old key and takes the new one; a revocation refuses every key, and the API stays closed', () => {
    const book = new TenantBook();
    const old = newTenantKey();
    const next = newTenantKey();
    book.apply(added('acme', old));
    const h = keyHash(next);
    book.apply(ev('tenant.key_rotated', { tenant: 'acme', keyHash: h, keyId: keyIdOf(h) }, 5000));
    expect(book.authenticate(old)).toBeNull();
    expect(book.authenticate(next)).toMatchObject({
      name: 'acme',
      keyId: keyIdOf(h),
      rotatedAt: 5000,
    });
    book.apply(ev('tenant.revoked', { tenant: 'acme' }, 6000));
    expect(book.authenticate(next)).toBeNull();
    expect(book.get('acme')).toMatchObject({ revokedAt: 6000 });
    // Revoking the last tenant must not open the API to anyone.
    expect(book.closed).toBe(true);
    // A rotation after the revocation is ignored: a revoked tenant gets no key back.
    const late = newTenantKey();
    const lh = keyHash(late);
    book.apply(ev('tenant.key_rotated', { tenant: 'acme', keyHash: lh, keyId: keyIdOf(lh) }));
    expect(book.authenticate(late)).toBeNull();
  });

  it('lists tenants by name with no key and no hash in them', () => {
    const book = new TenantBook();
    book.apply(added('zeta', newTenantKey()));
    book.apply(added('alpha', newTenantKey()));
    const rows = book.list();
    expect(rows.map((t) => t.name)).toEqual(['alpha', 'zeta']);
    for (const t of rows) {
      expect(Object.keys(t).sort()).toEqual(
        [
          'addedAt',
          'band',
          'keyId',
          'maxConcurrency',
          'name',
          'revokedAt',
          'rotatedAt',
          'tokensPerMinute',
        ].sort(),
      );
    }
  });
});
