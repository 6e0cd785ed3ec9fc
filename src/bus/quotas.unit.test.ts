import { describe, expect, it } from 'vitest';
import { PeerQuotas, TokenBucket } from './quotas.ts';

describe('TokenBucket', () => {
  it('gives a burst, then the sustained rate', () => {
    const b = new TokenBucket(10, 3, 0);
    expect([b.take(0), b.take(0), b.take(0), b.take(0)]).toEqual([true, true, true, false]);
    expect(b.take(50)).toBe(false); // half a token back
    expect(b.take(100)).toBe(true);
    // Never more than the burst, however long it rested.
    expect([b.take(60_000), b.take(60_000), b.take(60_000), b.take(60_000)]).toEqual([
      true,
      true,
      true,
      false,
    ]);
  });
});

describe('PeerQuotas', () => {
  const q = () =>
    new PeerQuotas({
      messagesPerSecond: 100,
      messagesBurst: 10,
      hellosPerSecond: 1,
      hellosBurst: 2,
    });

  it('drops a peer over its message quota, and reports only the first drop of an episode', () => {
    const quotas = q();
    for (let i = 0; i < 10; i++) expect(quotas.admit('a', 1, 0, 0).ok).toBe(true);
    expect(quotas.admit('a', 1, 0, 0)).toEqual({ ok: false, kind: 'messages', first: true });
    expect(quotas.admit('a', 1, 0, 1)).toEqual({ ok: false, kind: 'messages', first: false });
    // Another peer has its own quota.
    expect(quotas.admit('b', 1, 0, 1).ok).toBe(true);
    expect(quotas.dropped('a')).toBe(2);
    // Within quota for over 10 s: the next drop starts a new episode.
    expect(quotas.admit('a', 1, 0, 11_000).ok).toBe(true);
    for (let i = 0; i < 9; i++) quotas.admit('a', 1, 0, 11_000);
    expect(quotas.admit('a', 1, 0, 11_000)).toEqual({ ok: false, kind: 'messages', first: true });
  });

  it('limits hellos on their own, far below other messages', () => {
    const quotas = q();
    expect(quotas.admit('a', 1, 1, 0).ok).toBe(true);
    expect(quotas.admit('a', 1, 1, 0).ok).toBe(true);
    expect(quotas.admit('a', 1, 1, 0)).toEqual({ ok: false, kind: 'hellos', first: true });
    expect(quotas.admit('a', 1, 0, 0).ok).toBe(true);
    expect(quotas.admit('a', 1, 1, 1000).ok).toBe(true);
  });
});
