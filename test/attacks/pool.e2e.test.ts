/**
 * A few long requests used to exhaust the decode pool (pages are reserved for
 * the full max_tokens) and the canaries' `kv_pool_full` failures then took healthy engines up the
 * escalation ladder. Admission now counts pages: a request waits while the pool is full (429 with Retry-After past
 * its time-to-live), 400
 * for a request no pool could ever hold, and a full pool is never a stall.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Served, serve } from '../helpers/serve.ts';
import { startTestStack, waitFor } from '../helpers/stack.ts';

// 1200 pages of 64 tokens: 76,800 tokens of KV per engine.
let s: Served;
beforeAll(async () => {
  s = await serve([
    // Requests of up to 100,000 tokens: past the built-in model's default context (32768).
    '--context-size',
    '131072',
    '--pages',
    '1200',
    '--decode-us-per-token',
    '2000',
    '--canary-interval-ms',
    '200',
  ]);
}, 60_000);
afterAll(async () => {
  await s?.stop();
});

function complete(maxTokens: number, signal?: AbortSignal, headers: Record<string, string> = {}) {
  return fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify({
      model: 'pdctl-deterministic-1',
      prompt: 'the long river',
      max_tokens: maxTokens,
      stream: true,
    }),
    signal,
  });
}

describe('KV pool admission', () => {
  it('counts pages: 429 while the pool is full, 400 when it never could hold the request, no stall', async () => {
    const never = await complete(100_000);
    expect(never.status).toBe(400);
    expect(((await never.json()) as { error: { message: string } }).error.message).toMatch(
      /needs 100003 tokens of KV .* 1563 pages, but the largest decode KV pool has 1200 pages/,
    );
    // Two requests of 40,000 tokens: 626 pages each, and only 1200 in the pool.
    const holding = new AbortController();
    const first = await complete(40_000, holding.signal);
    expect(first.status).toBe(200);
    // It may not wait (x-pdctl-queue-ttl-ms: 0): refused now. (One that waited would hold the
    // small request below behind it: flow control does not let small requests starve a large one.)
    const second = await complete(40_000, undefined, { 'x-pdctl-queue-ttl-ms': '0' });
    expect(second.status).toBe(429);
    expect(second.headers.get('retry-after')).toBe('1');
    expect(((await second.json()) as { error: { message: string } }).error.message).toMatch(
      /no decode engine has the KV pages .* free now \(most free: 57\d of 1200 pages\)/,
    );
    // A small request still fits beside it.
    const small = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'pdctl-deterministic-1', prompt: 'a', max_tokens: 4 }),
    });
    expect(small.status).toBe(200);
    // The canaries ran on meanwhile (every 200 ms) and never failed on a full pool.
    const canaries = async () =>
      Number(
        /pdctl_canary_runs_total\{outcome="ok"\} (\d+)/.exec(
          await (await fetch(`${s.url}/metrics`)).text(),
        )?.[1] ?? 0,
      );
    const ran = await canaries();
    await waitFor('five more canaries', async () => (await canaries()) >= ran + 5);
    const engines = (await (await fetch(`${s.url}/v1/engines`)).json()) as {
      engines: Array<{ id: string; recovery: { phase: string } | null; restarts: number | null }>;
    };
    for (const e of engines.engines) {
      expect(e.recovery?.phase, e.id).toBe('ok');
      expect(e.restarts, e.id).toBe(0);
    }
    const stalled = await (await fetch(`${s.url}/v1/journal?type=engine.stalled`)).text();
    expect(stalled.trim()).toBe('');
    // The client leaves: its pages come back, and the same request is admitted.
    holding.abort();
    await waitFor('the pages released', async () => {
      const again = await complete(40_000);
      if (again.status === 200) {
        await again.body?.cancel();
        return true;
      }
      await again.body?.cancel();
      return false;
    });
  });

  it('a canary that found a full pool never counts against the engine', async () => {
    const { control } = await startTestStack();
    const pair = { prefillEngine: 'prefill-0', decodeEngine: 'decode-0' };
    const full = {
      ok: false,
      stage: 'bootstrap',
      reason: 'room r failed: kv_pool_full (in bootstrapping)',
      failure: 'kv_pool_full' as const,
    };
    for (let i = 0; i < 5; i++) control.noteCanary(pair, full);
    expect(control.registry.get('decode-0')?.health.canaryFailures).toBe(0);
    const late = 'no progress past bootstrapping within 2000 ms';
    control.noteCanary(pair, { ok: false, stage: 'bootstrap', reason: late, failure: null });
    expect(control.registry.get('decode-0')?.health.canaryFailures).toBe(1);
  });
});
