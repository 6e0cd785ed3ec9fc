/**
 * Flow control over a fleet of a fixed number of room slots (a stand-in for the control plane's
 * submit, the part it sits in front of), on the simulator's virtual clock.
 */
import { describe, expect, it } from 'vitest';
import { VirtualClock } from '../../sim/world/clock.ts';
import type { Tenant } from '../../tenants/book.ts';
import { ControlError } from '../errors.ts';
import type { RoomStream } from '../intake/streams.ts';
import type { SubmitRequest } from '../options.ts';
import { FlowControl, type FlowOptions, FlowRefusal, type Waited } from './flow-control.ts';

function tenant(name: string, o: Partial<Tenant> = {}): Tenant {
  return {
    name,
    band: 'interactive',
    maxConcurrency: null,
    tokensPerMinute: null,
    keyId: '00000000',
    addedAt: 0,
    rotatedAt: null,
    revokedAt: null,
    ...o,
  };
}

/** A fleet of `slots` rooms: a submit past them is CONTROL_OVERLOADED; `end()` frees the oldest. */
function fleet(slots: number, o: Partial<FlowOptions> = {}, tokenizeMs = 0) {
  const clock = new VirtualClock();
  const rooms: Array<{ request: SubmitRequest; end(): void }> = [];
  const waited: Waited[] = [];
  const flow = new FlowControl(
    {
      clock,
      submit(request) {
        if (rooms.length >= slots)
          throw new ControlError('CONTROL_OVERLOADED', 'no engine has the KV pages free now');
        let end = () => {};
        const result = new Promise<never>((_, reject) => {
          end = () => reject(new Error('ended'));
        });
        result.catch(() => {});
        rooms.push({ request, end });
        return { promptTokens: 1, tokens: 0, result } as unknown as RoomStream;
      },
      // A loaded machine: tokenizing the prompt may take a millisecond of the request's time.
      tokenize: () => {
        clock.advance(tokenizeMs);
        return [1];
      },
      waited: (w) => waited.push(w),
    },
    {
      queueMax: 100,
      queueTtlMs: { interactive: 1000, batch: 5000 },
      admissionWaitMs: 3000,
      ...o,
    },
  );
  const end = () => {
    const r = rooms.shift();
    r?.end();
    flow.wake();
  };
  return { clock, rooms, waited, flow, end };
}

const ask = (f: ReturnType<typeof fleet>, id: string, o: Record<string, unknown> = {}) => {
  const p = f.flow.admit({ prompt: id, maxTokens: 3, requestId: id, ...o });
  p.catch(() => {});
  return p;
};

describe('FlowControl', () => {
  it('asks the fleet to keep room for interactive requests while they come: batch ones are taken with headroom until the interactive time-to-live after the last', async () => {
    const f = fleet(10);
    const batch = tenant('etl', { band: 'batch' });
    await ask(f, 'b1', { tenant: batch });
    await ask(f, 'i1', { tenant: tenant('chat') });
    await ask(f, 'b2', { tenant: batch });
    f.clock.advance(1001);
    await ask(f, 'b3', { tenant: batch });
    expect(f.rooms.map((r) => [r.request.requestId, r.request.headroom ?? false])).toEqual([
      ['b1', false],
      ['i1', false],
      ['b2', true],
      ['b3', false],
    ]);
  });

  it('holds a request while the fleet is full and takes it when a room ends, recording how long it waited', async () => {
    const f = fleet(1);
    await ask(f, 'a');
    const b = ask(f, 'b');
    f.clock.advance(300);
    expect(f.flow.waiting).toBe(1);
    f.end();
    // A wake is a timer of 0 ms: 1 ms, as Node's.
    f.clock.advance(1);
    await b;
    expect(f.rooms.map((r) => [r.request.requestId, r.request.waitedMs])).toEqual([['b', 301]]);
    expect(f.waited).toEqual([
      { requestId: 'b', tenant: null, reason: 'overloaded', waitedMs: 301 },
    ]);
  });

  it('refuses at its time-to-live with what held it, and at once when its client asked for 0', async () => {
    const f = fleet(0);
    const late = ask(f, 'late');
    const now = ask(f, 'now', { ttlMs: 0 });
    await expect(now).rejects.toMatchObject({ code: 'CONTROL_OVERLOADED' });
    // A client may shorten its wait, never lengthen it: 5 s asked, the band's 1 s holds.
    const long = ask(f, 'long', { ttlMs: 5000 });
    f.clock.advance(1000);
    await expect(late).rejects.toThrow(
      /no engine has the KV pages free now \(waited 1000 ms in the interactive queue, its time-to-live\)/,
    );
    await expect(long).rejects.toMatchObject({ code: 'CONTROL_OVERLOADED' });
    expect(f.flow.waiting).toBe(0);
  });

  it("answers a request that may not wait with its tenant's limit when the tenant's earlier one waits on it", async () => {
    const f = fleet(10);
    const one = tenant('one', { maxConcurrency: 1 });
    await ask(f, 'a', { tenant: one });
    const b = ask(f, 'b', { tenant: one });
    const c = ask(f, 'c', { tenant: one, ttlMs: 0 });
    await expect(c).rejects.toBeInstanceOf(FlowRefusal);
    await expect(c).rejects.toMatchObject({
      code: 'CONTROL_TENANT_CONCURRENCY_LIMIT',
      retryAfterS: 1,
    });
    // The slot comes back when the room's result settles (a promise), which wakes the queue.
    f.end();
    await new Promise((r) => setImmediate(r));
    f.clock.advance(1);
    await b;
    expect(f.waited.map((w) => [w.requestId, w.tenant, w.reason])).toEqual([
      ['b', 'one', 'tenant_concurrency_limit'],
    ]);
  });

  it('tries a request that may not wait before it answers it, however long it took to come in', async () => {
    const f = fleet(10, {}, 1);
    const one = tenant('one', { maxConcurrency: 1 });
    await ask(f, 'a', { tenant: one });
    await expect(ask(f, 'b', { tenant: one, ttlMs: 0 })).rejects.toMatchObject({
      code: 'CONTROL_TENANT_CONCURRENCY_LIMIT',
    });
    await expect(ask(f, 'c', { ttlMs: 0 })).resolves.toBeDefined();
  });

  it('sheds a batch request for an interactive one at its bound, and takes interactive first', async () => {
    const f = fleet(0, { queueMax: 2 });
    const bulk = tenant('bulk', { band: 'batch' });
    const b1 = ask(f, 'b1', { tenant: bulk });
    const b2 = ask(f, 'b2', { tenant: bulk });
    const i1 = ask(f, 'i1');
    await expect(b2).rejects.toMatchObject({ code: 'CONTROL_QUEUE_FULL' });
    const i2 = ask(f, 'i2');
    await expect(b1).rejects.toMatchObject({ code: 'CONTROL_QUEUE_FULL' });
    const i3 = ask(f, 'i3');
    await expect(i3).rejects.toThrow(/2 requests wait to be served/);
    expect(f.flow.snapshot().interactive.requests).toBe(2);
    f.flow.close(new ControlError('CONTROL_CLOSED', 'shutting down: go elsewhere'));
    await expect(i1).rejects.toThrow('shutting down: go elsewhere');
    await expect(i2).rejects.toThrow('shutting down: go elsewhere');
    // What comes later is told the same; a client already gone is not queued at all.
    await expect(ask(f, 'late')).rejects.toThrow('shutting down: go elsewhere');
    const g = fleet(0);
    const gone = new AbortController();
    gone.abort();
    await expect(ask(g, 'gone', { signal: gone.signal })).rejects.toThrow(/left before its turn/);
    expect(g.flow.waiting).toBe(0);
  });
});
