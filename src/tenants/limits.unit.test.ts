import { describe, expect, it } from 'vitest';
import type { Tenant } from './book.ts';
import { TenantLimits } from './limits.ts';

function tenant(over: Partial<Tenant>): Tenant {
  return {
    name: 'acme',
    band: 'interactive',
    maxConcurrency: null,
    tokensPerMinute: null,
    keyId: '00000000',
    addedAt: 0,
    rotatedAt: null,
    revokedAt: null,
    ...over,
  };
}

describe("a tenant's own limits", () => {
  it('take requests up to its max concurrency, and one more once one ends', () => {
    const limits = new TenantLimits();
    const t = tenant({ maxConcurrency: 2 });
    expect(limits.admit(t, 0)).toEqual({ ok: true });
    expect(limits.admit(t, 0)).toEqual({ ok: true });
    expect(limits.headers(t, 0)).toMatchObject({
      'x-ratelimit-limit-requests': '2',
      'x-ratelimit-remaining-requests': '0',
    });
    expect(limits.admit(t, 0)).toMatchObject({ ok: false, limit: 'concurrency', retryAfterS: 1 });
    limits.release(t, 0, 0);
    expect(limits.admit(t, 0)).toEqual({ ok: true });
    // Another tenant has its own.
    expect(limits.admit(tenant({ name: 'other', maxConcurrency: 1 }), 0)).toEqual({ ok: true });
  });

  it('charge tokens a minute from a bucket that refills, refuse it empty until it has one again, and give back what was not used', () => {
    const limits = new TenantLimits();
    const t = tenant({ tokensPerMinute: 600 }); // 10 a second
    expect(limits.admit(t, 0)).toEqual({ ok: true });
    limits.charge(t, 650, 0); // a request may run the bucket into debt: -50
    const refused = limits.admit(t, 0);
    // 51 tokens to reach 1: 6 s at 10 a second.
    expect(refused).toMatchObject({ ok: false, limit: 'tokens', retryAfterS: 6 });
    expect(limits.headers(t, 0)).toMatchObject({
      'x-ratelimit-limit-tokens': '600',
      'x-ratelimit-remaining-tokens': '0',
    });
    expect(limits.admit(t, 6000)).toEqual({ ok: true });
    // The first request ends having used 150 of its 650: 500 come back (capped at the minute).
    limits.release(t, 500, 6000);
    expect(limits.headers(t, 6000)['x-ratelimit-remaining-tokens']).toBe('510');
    limits.release(t, 10_000, 6000);
    expect(limits.headers(t, 6000)['x-ratelimit-remaining-tokens']).toBe('600');
  });

  it('hold nothing back for a tenant without limits, and send no headers for it', () => {
    const limits = new TenantLimits();
    const t = tenant({});
    for (let i = 0; i < 1000; i++) expect(limits.admit(t, 0)).toEqual({ ok: true });
    expect(limits.headers(t, 0)).toEqual({});
  });
});
