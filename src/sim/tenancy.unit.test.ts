/**
 * The tenancy checks each name what breaks them, and pass what keeps them: limits, fair shares,
 * interactive first — on traces and outcomes made to break each one.
 */
import { describe, expect, it } from 'vitest';
import type { JournalEvent } from '../room/events.ts';
import type { ClientOutcome } from './client.ts';
import { FAIR_WINDOW_MS, fairShares, interactiveFirst, tenantLimits } from './tenancy.ts';
import type { SimTenant } from './workload.ts';

const T = (
  name: string,
  band: 'interactive' | 'batch',
  c: number | null = null,
  tpm: number | null = null,
): SimTenant => ({
  name,
  band,
  maxConcurrency: c,
  tokensPerMinute: tpm,
});

let seq = 0;
function created(
  room: string,
  tenant: string,
  ts: number,
  prompt = 10,
  maxTokens = 10,
): JournalEvent {
  return {
    seq: ++seq,
    ts,
    type: 'room.created',
    room,
    engine: null,
    source: 'api',
    eventId: `${room}:created`,
    data: { tenant, requestId: room, promptTokens: prompt, maxTokens },
  } as unknown as JournalEvent;
}
function completed(room: string, ts: number, tokens = 10): JournalEvent {
  return {
    seq: ++seq,
    ts,
    type: 'room.completed',
    room,
    engine: 'd0',
    source: 'd0',
    eventId: `${room}:completed`,
    data: { tokens, finishReason: 'length' },
  } as unknown as JournalEvent;
}

function outcome(
  id: string,
  tenant: string | null,
  askedAt: number,
  admittedAt: number | null,
  cost = 10,
): ClientOutcome {
  return {
    request: {
      id,
      at: 0,
      prompt: 'p',
      prefix: null,
      maxTokens: 1,
      stream: false,
      action: null,
      tenant,
    },
    text: '',
    error: admittedAt === null ? 'refused' : null,
    finishReason: null,
    askedAt,
    settledAt: admittedAt ?? askedAt + 1,
    ...(admittedAt === null ? {} : { admittedAt, cost }),
  };
}

describe('tenantLimits', () => {
  const roster = new Map([['acme', T('acme', 'interactive', 2)]]);

  it('names a tenant with more rooms live than its max concurrency, and passes one within it', () => {
    const over = [created('r1', 'acme', 1), created('r2', 'acme', 2), created('r3', 'acme', 3)];
    expect(tenantLimits(over, roster, []).map((v) => v.invariant)).toEqual([
      'tenant_within_limits',
    ]);
    const within = [
      created('r4', 'acme', 1),
      created('r5', 'acme', 2),
      completed('r4', 3),
      created('r6', 'acme', 4),
    ];
    expect(tenantLimits(within, roster, [])).toEqual([]);
  });

  it("counts a restarted control plane's rooms afresh: its limits start from nothing in flight", () => {
    const a = created('r7', 'acme', 1);
    const b = created('r8', 'acme', 2);
    const c = created('r9', 'acme', 3);
    expect(tenantLimits([a, b, c], roster, [b.seq])).toEqual([]);
  });

  it('names a tenant that used more tokens in a minute than its bucket can give', () => {
    const thrifty = new Map([['t', T('t', 'batch', null, 600)]]);
    // 600 a minute, a bucket of 600: 30 requests of 100 tokens in a second is 3,000.
    const burst = Array.from({ length: 30 }, (_, i) => [
      created(`b${i}`, 't', 1000 + i * 30, 50, 50),
      completed(`b${i}`, 1000 + i * 30 + 10, 50),
    ]).flat();
    expect(tenantLimits(burst, thrifty, []).map((v) => v.invariant)).toEqual([
      'tenant_within_limits',
    ]);
    const paced = Array.from({ length: 5 }, (_, i) => [
      created(`p${i}`, 't', 1000 + i * 12_000, 50, 50),
      completed(`p${i}`, 1000 + i * 12_000 + 10, 50),
    ]).flat();
    expect(tenantLimits(paced, thrifty, [])).toEqual([]);
  });
});

describe('fairShares', () => {
  const roster = new Map([
    ['a', T('a', 'batch')],
    ['b', T('b', 'batch')],
  ]);
  // Both wait from 0 to 30 s: a request each that waits it all out, and ones taken meanwhile.
  const waiting = [outcome('wa', 'a', 0, 30_000, 0), outcome('wb', 'b', 0, 30_000, 0)];
  const taken = (tenant: string, every: number) =>
    Array.from({ length: Math.floor(30_000 / every) }, (_, i) =>
      outcome(`${tenant}${i}`, tenant, i * every, i * every + 1),
    );

  it('names a backlogged tenant given under 0.8 of an equal share over 10 s', () => {
    const r = fairShares([...waiting, ...taken('a', 100), ...taken('b', 300)], roster);
    expect(r.judged).toBeGreaterThan(0);
    expect(r.violations[0]?.invariant).toBe('fair_share');
    expect(r.violations[0]?.detail).toMatch(/tenant b waited/);
  });

  it('passes even shares, and judges no window shorter than 10 s of both waiting', () => {
    const even = fairShares([...waiting, ...taken('a', 100), ...taken('b', 100)], roster);
    expect(even.judged).toBeGreaterThan(0);
    expect(even.violations).toEqual([]);
    const brief = [outcome('wa', 'a', 0, FAIR_WINDOW_MS - 1, 0), outcome('wb', 'b', 0, 30_000, 0)];
    expect(fairShares([...brief, ...taken('a', 100), ...taken('b', 300)], roster).judged).toBe(0);
  });
});

describe('interactiveFirst', () => {
  const roster = new Map([
    ['chat', T('chat', 'interactive')],
    ['limited', T('limited', 'interactive', 1)],
    ['etl', T('etl', 'batch')],
  ]);

  it('names a batch request taken while an interactive one had waited past the bound', () => {
    const v = interactiveFirst(
      [outcome('i', 'chat', 0, 1000), outcome('b', 'etl', 10, 500)],
      roster,
    );
    expect(v.map((x) => x.invariant)).toEqual(['interactive_first']);
  });

  it('passes one taken within the bound, and one past a tenant held by its own limits', () => {
    expect(
      interactiveFirst([outcome('i', 'chat', 0, 1000), outcome('b', 'etl', 10, 20)], roster),
    ).toEqual([]);
    expect(
      interactiveFirst([outcome('i', 'limited', 0, 1000), outcome('b', 'etl', 10, 500)], roster),
    ).toEqual([]);
  });
});
