/**
 * A tenant's own limits on the serving routes: rooms at once (`maxConcurrency`) and tokens a
 * minute (`tokensPerMinute`: a bucket of that many, refilled continuously). A request is taken
 * while the tenant has a room slot and tokens left; its prompt and `max_tokens` are taken from the
 * bucket once its room exists, and what it did not generate goes back when it ends. A request the
 * limits hold out is refused (429) with when to retry; the queue that will hold it instead, by
 * band and fair share, is the flow control still to come.
 */
import type { Tenant } from './book.ts';

export type LimitVerdict =
  | { ok: true }
  | { ok: false; limit: 'concurrency' | 'tokens'; retryAfterS: number; message: string };

/** OpenAI's rate-limit headers for a tenant: what its limits are and what is left of them. */
export type RateHeaders = Record<string, string>;

interface Bucket {
  level: number;
  at: number;
}

export class TenantLimits {
  private readonly inFlight = new Map<string, number>();
  private readonly buckets = new Map<string, Bucket>();

  private bucket(t: Tenant, now: number): Bucket | null {
    const cap = t.tokensPerMinute;
    if (cap === null) return null;
    let b = this.buckets.get(t.name);
    if (!b) {
      b = { level: cap, at: now };
      this.buckets.set(t.name, b);
    }
    b.level = Math.min(cap, b.level + ((now - b.at) * cap) / 60_000);
    b.at = now;
    return b;
  }

  /** Takes a request of `t` in (a room slot), or says which limit holds it out and for how long. */
  admit(t: Tenant, now: number): LimitVerdict {
    const running = this.inFlight.get(t.name) ?? 0;
    if (t.maxConcurrency !== null && running >= t.maxConcurrency) {
      return {
        ok: false,
        limit: 'concurrency',
        retryAfterS: 1,
        message: `tenant ${t.name} has ${running} requests in flight, its limit (max concurrency ${t.maxConcurrency}); retry when one ends`,
      };
    }
    const b = this.bucket(t, now);
    if (b !== null && b.level < 1) {
      const perS = (t.tokensPerMinute as number) / 60;
      return {
        ok: false,
        limit: 'tokens',
        retryAfterS: Math.max(1, Math.ceil((1 - b.level) / perS)),
        message: `tenant ${t.name} used its ${t.tokensPerMinute} tokens a minute; retry when the bucket refills`,
      };
    }
    this.inFlight.set(t.name, running + 1);
    return { ok: true };
  }

  /** The request's tokens, taken once its room exists (the bucket may go below zero: a debt). */
  charge(t: Tenant, tokens: number, now: number): void {
    const b = this.bucket(t, now);
    if (b) b.level -= tokens;
  }

  /** The request ended: its room slot back, and the tokens it was charged and did not use. */
  release(t: Tenant, unused: number, now: number): void {
    const running = this.inFlight.get(t.name) ?? 0;
    if (running <= 1) this.inFlight.delete(t.name);
    else this.inFlight.set(t.name, running - 1);
    const b = this.bucket(t, now);
    if (b && unused > 0) b.level = Math.min(t.tokensPerMinute as number, b.level + unused);
  }

  headers(t: Tenant, now: number): RateHeaders {
    const out: RateHeaders = {};
    if (t.maxConcurrency !== null) {
      out['x-ratelimit-limit-requests'] = String(t.maxConcurrency);
      out['x-ratelimit-remaining-requests'] = String(
        Math.max(0, t.maxConcurrency - (this.inFlight.get(t.name) ?? 0)),
      );
    }
    const b = this.bucket(t, now);
    if (b) {
      const cap = t.tokensPerMinute as number;
      out['x-ratelimit-limit-tokens'] = String(cap);
      out['x-ratelimit-remaining-tokens'] = String(Math.max(0, Math.floor(b.level)));
      out['x-ratelimit-reset-tokens'] = `${Math.max(0, Math.ceil(((cap - b.level) * 60) / cap))}s`;
    }
    return out;
  }
}
