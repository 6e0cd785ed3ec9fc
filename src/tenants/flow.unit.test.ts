import { describe, expect, it } from 'vitest';
import type { Band } from './book.ts';
import { type Attempt, FlowQueue, type FlowTicket } from './flow.ts';

let n = 0;
function ticket(tenant: string, band: Band, tokens = 10, at = n): FlowTicket {
  n++;
  return {
    requestId: `${tenant}-${n}`,
    tenant,
    band,
    tokens,
    enqueuedAt: at,
    deadline: at + 1000,
    waitingFor: null,
  };
}

/** A fleet with `slots` rooms free: each taken ticket uses one; then it holds the rest back. */
function fleet(slots: number): (t: FlowTicket) => Attempt {
  return () => (slots-- > 0 ? { kind: 'admitted' } : { kind: 'fleet', reason: 'overloaded' });
}

describe('FlowQueue', () => {
  it('takes every interactive request before any batch one, and none of batch while interactive waits on the fleet', () => {
    const q = new FlowQueue<FlowTicket>(100);
    const b = ticket('bulk', 'batch');
    const i1 = ticket('chat', 'interactive');
    const i2 = ticket('chat', 'interactive');
    for (const t of [b, i1, i2]) expect(q.push(t)).toBeNull();
    expect(q.pump(fleet(2))).toEqual([i1, i2]);
    // The fleet is full: the batch request waits, and says what for.
    expect(q.pump(fleet(0))).toEqual([]);
    expect(b.waitingFor).toBe('overloaded');
    expect(q.pump(fleet(5))).toEqual([b]);
    expect(q.size).toBe(0);
  });

  it('shares a band by tokens: a tenant of long prompts gets as many tokens as one of short ones, not as many requests', () => {
    const q = new FlowQueue<FlowTicket>(1000);
    for (let i = 0; i < 20; i++) q.push(ticket('long', 'batch', 100));
    for (let i = 0; i < 200; i++) q.push(ticket('short', 'batch', 10));
    const taken = q.pump(fleet(44));
    const tokens = (tenant: string) =>
      taken.filter((t) => t.tenant === tenant).reduce((s, t) => s + t.tokens, 0);
    expect(tokens('long')).toBe(400);
    expect(tokens('short')).toBe(400);
  });

  it('passes over a tenant held by its own limits without holding the band', () => {
    const q = new FlowQueue<FlowTicket>(100);
    const capped = ticket('capped', 'interactive');
    const other = ticket('other', 'interactive');
    const batch = ticket('bulk', 'batch');
    for (const t of [capped, other, batch]) q.push(t);
    const taken = q.pump((t) =>
      t.tenant === 'capped'
        ? { kind: 'tenant', reason: 'tenant_concurrency_limit' }
        : { kind: 'admitted' },
    );
    expect(taken).toEqual([other, batch]);
    expect(capped.waitingFor).toBe('tenant_concurrency_limit');
    expect(q.size).toBe(1);
  });

  it('gives a tenant back from idle no credit for the time it did not wait', () => {
    const q = new FlowQueue<FlowTicket>(1000);
    for (let i = 0; i < 50; i++) q.push(ticket('busy', 'batch', 10));
    q.pump(fleet(40));
    // `late` arrives after busy took 400 tokens: it shares from here on, it does not take 400 first.
    for (let i = 0; i < 50; i++) q.push(ticket('late', 'batch', 10));
    const taken = q.pump(fleet(10));
    expect(taken.filter((t) => t.tenant === 'late').length).toBe(5);
  });

  it('sheds the lowest band first at its bound — the newest request of the tenant whose backlog ends furthest ahead — and refuses a request of that tenant itself', () => {
    const q = new FlowQueue<FlowTicket>(3);
    const b1 = ticket('a', 'batch', 10);
    const b2 = ticket('b', 'batch', 10);
    const b3 = ticket('b', 'batch', 10);
    for (const t of [b1, b2, b3]) expect(q.push(t)).toBeNull();
    // a and b start even (a's goes first, by name): then a is a request ahead of b.
    expect(q.pump(fleet(1))).toEqual([b1]);
    const b4 = ticket('a', 'batch', 10);
    expect(q.push(b4)).toBeNull();
    const i1 = ticket('chat', 'interactive');
    expect(q.push(i1)).toBe(b4);
    // In its own band: c, new, would end at 10; b's backlog ends at 20, so b gives way.
    const b5 = ticket('c', 'batch');
    expect(q.push(b5)).toBe(b3);
    expect([...q.tickets()]).toEqual([i1, b2, b5]);
    // b's next would end furthest ahead itself: it is refused, and nothing else goes.
    const b6 = ticket('b', 'batch');
    expect(q.push(b6)).toBe(b6);
    expect([...q.tickets()]).toEqual([i1, b2, b5]);
  });

  it("sheds a flooding tenant's requests, not those of the tenants it crowds out", () => {
    const q = new FlowQueue<FlowTicket>(10);
    for (let i = 0; i < 10; i++) expect(q.push(ticket('flood', 'batch'))).toBeNull();
    const shed: string[] = [];
    for (let i = 0; i < 5; i++) {
      const light = ticket('light', 'batch');
      shed.push((q.push(light) as FlowTicket).tenant);
    }
    expect(shed).toEqual(['flood', 'flood', 'flood', 'flood', 'flood']);
    // Now even (5 each): the next of either is refused itself.
    const more = ticket('light', 'batch');
    expect(q.push(more)).toBe(more);
  });

  it('expires what waited past its deadline, and says when the next one is due', () => {
    const q = new FlowQueue<FlowTicket>(10);
    const early = ticket('a', 'batch', 10, 0);
    const late = { ...ticket('a', 'batch', 10, 0), deadline: 5000 };
    q.push(early);
    q.push(late);
    expect(q.nextDeadline()).toBe(1000);
    expect(q.expire(1000)).toEqual([]);
    expect(q.expire(1001)).toEqual([early]);
    expect(q.nextDeadline()).toBe(5000);
    expect(q.remove(late)).toBe(true);
    expect(q.remove(late)).toBe(false);
    expect(q.nextDeadline()).toBeNull();
  });
});
