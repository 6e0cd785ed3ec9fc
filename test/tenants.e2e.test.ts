/**
 * Tenants and keys through the front door: `pdctl tenants` on a journal and against a running
 * `pdctl serve`, and the serving routes refusing what a live tenant's key does not open.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { serve } from './helpers/serve.ts';
import { pdctl } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';
import { waitFor } from './helpers/wait.ts';

const MODEL = 'pdctl-deterministic-1';

function call(
  url: string,
  path: string,
  key?: string,
  body?: object,
  headers: Record<string, string> = {},
) {
  return fetch(`${url}${path}`, {
    method: body ? 'POST' : 'GET',
    headers: {
      ...(key ? { authorization: `Bearer ${key}` } : {}),
      ...(body ? { 'content-type': 'application/json' } : {}),
      ...headers,
    },
    ...(body ? { body: JSON.stringify(body) } : {}),
  });
}

const complete = (url: string, key?: string, headers: Record<string, string> = {}) =>
  call(url, '/v1/completions', key, { model: MODEL, prompt: 'the river', max_tokens: 4 }, headers);

/** What a tenant's clients were told. */
interface Told {
  requests: number;
  refused: number;
  promptTokens: number;
  completionTokens: number;
}

/** `GET /v1/usage`, and `pdctl usage --json`. */
interface Usage {
  since: number;
  until: number;
  tenants: Array<Told & { tenant: string | null; failed: number; waitedMs: number }>;
}

/** Asks not to wait in flow control's queue: refused at once when it cannot be served now. */
const NO_WAIT = { 'x-pdctl-queue-ttl-ms': '0' };

/** The key `pdctl tenants add|rotate` printed: its only stdout line. */
function keyOf(r: { code: number | null; stdout: string; stderr: string }): string {
  expect(r.code, r.stderr).toBe(0);
  const lines = r.stdout.trim().split('\n');
  expect(lines).toHaveLength(1);
  expect(lines[0]).toMatch(/^pdk-[A-Za-z0-9_-]{43}$/);
  return lines[0] as string;
}

describe('pdctl tenants', () => {
  it('keys in the journal open the serving routes to live tenants only; rooms record tenant and band; no key is kept or logged', async () => {
    const dir = tempDir('pdctl-tenants-');
    const journal = join(dir, 'journal.db');
    // Before any control plane runs: on the journal file.
    const acme = keyOf(await pdctl(['tenants', 'add', 'acme', '--journal', journal]));
    const again = await pdctl(['tenants', 'add', 'acme', '--journal', journal]);
    expect(again.code).toBe(2);
    expect(again.stderr).toMatch(/tenant acme exists .*pdctl tenants rotate acme/);
    const s = await serve(['--journal', journal]);
    const keys: string[] = [acme];
    try {
      const url = s.url;
      for (const key of [undefined, 'pdk-not-a-key']) {
        const res = await complete(url, key);
        expect(res.status).toBe(401);
        expect(await res.json()).toMatchObject({
          error: { type: 'invalid_request_error', code: 'invalid_api_key', param: null },
        });
      }
      expect((await call(url, '/v1/models')).status).toBe(401);
      expect((await call(url, '/v1/models', acme)).status).toBe(200);
      // The serving routes only: an operator's query route is not a tenant's (the admin token's).
      expect((await call(url, '/health/ready')).status).toBe(200);

      // Through the serving control plane: --json is {"tenant", "key"}.
      const added = await pdctl([
        'tenants',
        'add',
        'batcher',
        '--band',
        'batch',
        '--max-concurrency',
        '4',
        '--tokens-per-minute',
        '60000',
        '--url',
        url,
        '--json',
      ]);
      expect(added.code, added.stderr).toBe(0);
      const batcher = JSON.parse(added.stdout) as { tenant: string; key: string };
      expect(Object.keys(batcher).sort()).toEqual(['key', 'tenant']);
      keys.push(batcher.key);
      const res = await complete(url, batcher.key);
      expect(res.status).toBe(200);
      const { pdctl_room: room } = (await res.json()) as { pdctl_room: string };
      const timeline = (await (await call(url, `/v1/rooms/${room}`)).json()) as {
        events: Array<{ type: string; data: Record<string, unknown> }>;
      };
      expect(timeline.events.find((e) => e.type === 'room.created')?.data).toMatchObject({
        tenant: 'batcher',
        band: 'batch',
      });
      // What a tenant ran is a query of the rooms: pdctl rooms --tenant, GET /v1/rooms?tenant=.
      const ran = await pdctl(['rooms', '--tenant', 'batcher', '--url', url, '--json']);
      expect(ran.code, ran.stderr).toBe(0);
      expect(
        (JSON.parse(ran.stdout) as { rooms: Array<{ room: string; tenant: string }> }).rooms,
      ).toEqual([expect.objectContaining({ room, tenant: 'batcher' })]);
      const none = (await (await call(url, '/v1/rooms?tenant=acme')).json()) as {
        rooms: unknown[];
      };
      expect(none.rooms).toEqual([]);

      // A rotation refuses the old key at once; a revocation refuses the tenant's.
      const rotated = keyOf(await pdctl(['tenants', 'rotate', 'acme', '--url', url]));
      keys.push(rotated);
      expect((await complete(url, acme)).status).toBe(401);
      expect((await complete(url, rotated)).status).toBe(200);
      const revoked = await pdctl([
        'tenants',
        'revoke',
        'batcher',
        '--url',
        url,
        '--reason',
        'test',
      ]);
      expect(revoked.code, revoked.stderr).toBe(0);
      expect((await complete(url, batcher.key)).status).toBe(401);
      const unknown = await pdctl(['tenants', 'revoke', 'nobody', '--url', url]);
      expect(unknown.code).toBe(2);
      expect(unknown.stderr).toMatch(/no tenant nobody; tenants: acme, batcher/);

      // The journal is written by serve: the CLI says to go through it.
      const busy = await pdctl(['tenants', 'add', 'late', '--journal', journal]);
      expect(busy.code).toBe(2);
      expect(busy.stderr).toMatch(/run the command with --url/);

      const list = await pdctl(['tenants', 'list', '--url', url, '--json']);
      const rows = JSON.parse(list.stdout) as Array<Record<string, unknown>>;
      expect(
        rows.map((t) => [
          t.name,
          t.band,
          t.maxConcurrency,
          t.tokensPerMinute,
          t.revokedAt !== null,
        ]),
      ).toEqual([
        ['acme', 'interactive', null, null, false],
        ['batcher', 'batch', 4, 60000, true],
      ]);
      const bad = await pdctl(['tenants', 'add', 'x', '--max-concurrency', '0', '--url', url]);
      expect(bad.code).toBe(2);
      expect(bad.stderr).toMatch(/--max-concurrency must be a whole number of at least 1, got 0/);
      for (const key of keys) expect(list.stdout).not.toContain(key);
    } finally {
      expect(await s.stop()).toBe(0);
    }
    // No key in the log, nor in any file of the journal: only their hashes.
    const files = readdirSync(dir).filter((f) => f.startsWith('journal.db'));
    for (const key of keys) {
      expect(s.stderr()).not.toContain(key);
      for (const f of files) expect(readFileSync(join(dir, f)).includes(key)).toBe(false);
    }
    // A control plane started again serves the same tenants: from the journal, the rotated key.
    const t = await serve(['--journal', journal]);
    try {
      await waitFor('serve to say that keys are needed', () =>
        /the serving routes need a tenant's key \(1 of 2 tenants live\)/.test(t.stderr()),
      );
      expect((await complete(t.url, keys[2])).status).toBe(200);
      expect((await complete(t.url, acme)).status).toBe(401);
      // Every tenant revoked: the API stays closed rather than opening to anyone.
      expect((await pdctl(['tenants', 'revoke', 'acme', '--url', t.url])).code).toBe(0);
      expect((await complete(t.url)).status).toBe(401);
    } finally {
      expect(await t.stop(), t.stderr().slice(-3000)).toBe(0);
    }
  }, 90_000);

  it('with an admin token: tenants need it, the query routes need it or a tenant key, and a tenant reads only its own rooms', async () => {
    const s = await serve([], { PDCTL_ADMIN_TOKEN: 'sesame' });
    try {
      // The query routes: nothing without the token, everything with it.
      expect((await call(s.url, '/v1/rooms')).status).toBe(401);
      expect((await call(s.url, '/v1/rooms', 'sesame')).status).toBe(200);
      const refused = await pdctl(['tenants', 'add', 'acme', '--url', s.url], {
        env: { PDCTL_ADMIN_TOKEN: '' },
      });
      expect(refused.code).toBe(2);
      expect(refused.stderr).toMatch(/set PDCTL_ADMIN_TOKEN/);
      // Nothing was added: the API is still open.
      expect((await complete(s.url)).status).toBe(200);
      const key = keyOf(
        await pdctl(['tenants', 'add', 'acme', '--url', s.url], {
          env: { PDCTL_ADMIN_TOKEN: 'sesame' },
        }),
      );
      expect((await complete(s.url)).status).toBe(401);
      const mine = (await (await complete(s.url, key)).json()) as { pdctl_room: string };
      const other = keyOf(
        await pdctl(['tenants', 'add', 'other', '--url', s.url], {
          env: { PDCTL_ADMIN_TOKEN: 'sesame' },
        }),
      );
      const theirs = (await (await complete(s.url, other)).json()) as { pdctl_room: string };
      // A tenant's key: its own rooms, their timelines and events; not another's, not the fleet.
      const listed = (await (await call(s.url, '/v1/rooms', key)).json()) as {
        rooms: Array<{ room: string }>;
      };
      expect(listed.rooms.map((r) => r.room)).toEqual([mine.pdctl_room]);
      expect((await call(s.url, `/v1/rooms/${mine.pdctl_room}`, key)).status).toBe(200);
      expect((await call(s.url, `/v1/rooms/${theirs.pdctl_room}`, key)).status).toBe(404);
      expect((await call(s.url, `/v1/journal?room=${mine.pdctl_room}`, key)).status).toBe(200);
      expect((await call(s.url, `/v1/journal?room=${theirs.pdctl_room}`, key)).status).toBe(404);
      const whole = await call(s.url, '/v1/journal', key);
      expect(whole.status).toBe(403);
      expect(await whole.json()).toMatchObject({ error: { code: 'forbidden' } });
      for (const route of ['/v1/engines', '/v1/live', '/v1/stats'])
        expect((await call(s.url, route, key)).status, route).toBe(403);
      // Its own usage, whichever tenant it asks for; the token reads every tenant's.
      const own = (await (await call(s.url, '/v1/usage?tenant=other', key)).json()) as Usage;
      expect(own.tenants.map((u) => [u.tenant, u.requests])).toEqual([['acme', 1]]);
      const all = (await (await call(s.url, '/v1/usage', 'sesame')).json()) as Usage;
      expect(all.tenants.map((u) => [u.tenant, u.requests])).toEqual([
        ['acme', 1],
        ['other', 1],
        [null, 1],
      ]);
      expect((await call(s.url, '/v1/usage')).status).toBe(401);
      // The CLI reads as an operator with the token.
      const rooms = await pdctl(['rooms', '--url', s.url, '--json'], {
        env: { PDCTL_ADMIN_TOKEN: 'sesame' },
      });
      expect(rooms.code, rooms.stderr).toBe(0);
      // Every room: the open API's one before the first tenant, and each tenant's.
      expect(JSON.parse(rooms.stdout).rooms).toHaveLength(3);
      // /metrics and the health routes stay open: scrapers and load balancers.
      expect((await call(s.url, '/metrics')).status).toBe(200);
      expect((await call(s.url, '/health')).status).toBe(200);
    } finally {
      expect(await s.stop()).toBe(0);
    }
  }, 60_000);
});

describe("a tenant's own limits", () => {
  it('--max-concurrency and --tokens-per-minute: a request past them waits its turn, or with no time to wait is 429 with Retry-After and x-ratelimit-* headers; both journaled with the tenant, and pdctl usage adds up what its clients were told', async () => {
    // 20 ms a token: a 100-token room holds its tenant's slot for about 2 s.
    const s = await serve(['--decode-us-per-token', '20000']);
    // What each tenant's clients were told: answers and their usage, refusals.
    const told = new Map<string, Told>();
    const tally = async (tenant: string, res: Response): Promise<Response> => {
      const t = told.get(tenant) ?? {
        requests: 0,
        refused: 0,
        promptTokens: 0,
        completionTokens: 0,
      };
      told.set(tenant, t);
      if (res.status === 429) t.refused++;
      if (res.status !== 200) return res;
      const { usage } = (await res.clone().json()) as {
        usage: { prompt_tokens: number; completion_tokens: number };
      };
      t.requests++;
      t.promptTokens += usage.prompt_tokens;
      t.completionTokens += usage.completion_tokens;
      return res;
    };
    try {
      const add = async (name: string, flags: string[]) =>
        keyOf(await pdctl(['tenants', 'add', name, ...flags, '--url', s.url]));
      const one = await add('one-at-a-time', ['--max-concurrency', '1']);
      const long = call(s.url, '/v1/completions', one, {
        model: MODEL,
        prompt: 'the river',
        max_tokens: 100,
      }).then((r) => tally('one-at-a-time', r));
      await waitFor('its room in flight', async () => {
        const live = (await (await call(s.url, '/v1/live')).json()) as { rooms: unknown[] };
        return live.rooms.length > 0;
      });
      // One that may wait is served once the long one ends; one that may not is refused now.
      const queued = complete(s.url, one, { 'x-request-id': 'queued-1' }).then((r) =>
        tally('one-at-a-time', r),
      );
      const held = await tally('one-at-a-time', await complete(s.url, one, NO_WAIT));
      expect(held.status).toBe(429);
      expect(held.headers.get('retry-after')).toBe('1');
      expect(held.headers.get('x-ratelimit-limit-requests')).toBe('1');
      expect(held.headers.get('x-ratelimit-remaining-requests')).toBe('0');
      expect(await held.json()).toMatchObject({
        error: { type: 'rate_limit_error', code: 'tenant_concurrency_limit' },
      });
      expect((await long).status).toBe(200);
      const served = await queued;
      expect(served.status).toBe(200);
      const created = (await (
        await call(
          s.url,
          `/v1/journal?type=room.created&room=${served.headers.get('x-pdctl-room')}`,
        )
      ).json()) as {
        data: { tenant: string; requestId: string; waitedMs?: number };
      };
      expect(created.data).toMatchObject({ tenant: 'one-at-a-time', requestId: 'queued-1' });
      expect(created.data.waitedMs).toBeGreaterThan(0);
      expect((await tally('one-at-a-time', await complete(s.url, one))).status).toBe(200);

      // 60 tokens a minute: a request of 1 prompt token and 80 max runs the bucket dry.
      const thrifty = await add('thrifty', ['--tokens-per-minute', '60']);
      const first = await tally(
        'thrifty',
        await call(s.url, '/v1/completions', thrifty, {
          model: MODEL,
          prompt: 'the river',
          max_tokens: 80,
        }),
      );
      expect(first.status).toBe(200);
      expect(first.headers.get('x-ratelimit-limit-tokens')).toBe('60');
      const dry = await tally('thrifty', await complete(s.url, thrifty, NO_WAIT));
      expect(dry.status).toBe(429);
      expect(Number(dry.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect(await dry.json()).toMatchObject({ error: { code: 'tenant_token_limit' } });
      // Other tenants are not held by them.
      const free = await add('free', []);
      expect((await tally('free', await complete(s.url, free))).status).toBe(200);

      // On the record: request.refused, per reason and tenant, with the request ids.
      await waitFor('the refusals journaled', async () => {
        const tail = await pdctl(['journal', 'tail', '--type', 'request.refused', '--url', s.url]);
        return (
          /tenant_token_limit/.test(tail.stdout) && /tenant_concurrency_limit/.test(tail.stdout)
        );
      });
      const text = await (await call(s.url, '/v1/journal?type=request.refused')).text();
      const events = text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as { data: { reason: string; tenant?: string; count: number } });
      expect(events.map((e) => [e.data.reason, e.data.tenant, e.data.count]).sort()).toEqual([
        ['tenant_concurrency_limit', 'one-at-a-time', 1],
        ['tenant_token_limit', 'thrifty', 1],
      ]);
      // And the wait, per reason and tenant, with its request id.
      const waits = async () =>
        (await (await call(s.url, '/v1/journal?type=request.waited')).text())
          .split('\n')
          .filter((l) => l !== '')
          .map((l) => JSON.parse(l) as { data: { requestIds: string[] } })
          .filter((e) => e.data.requestIds.includes('queued-1'));
      await waitFor('the wait journaled', async () => (await waits()).length === 1);
      expect((await waits())[0]?.data).toMatchObject({
        reason: 'tenant_concurrency_limit',
        tenant: 'one-at-a-time',
        count: 1,
        requestIds: ['queued-1'],
        maxWaitedMs: created.data.waitedMs,
      });

      // Usage from the record equals what the clients were told: the route, the command over
      // it, the per-tenant metrics, and (below) the command on the journal file. Time waited is
      // not told to clients: it is what each room recorded of its own wait (`waitsIn`: per
      // tenant, summed over the events of a type).
      const waitsIn = async (type: string) => {
        const sums = new Map<string, number>();
        for (const l of (await (await call(s.url, `/v1/journal?type=${type}`)).text())
          .split('\n')
          .filter((l) => l !== '')) {
          const { data } = JSON.parse(l) as { data: { tenant?: string; waitedMs?: number } };
          if (data.tenant)
            sums.set(data.tenant, (sums.get(data.tenant) ?? 0) + (data.waitedMs ?? 0));
        }
        return sums;
      };
      const roomWaits = await waitsIn('room.created');
      expect(roomWaits.get('one-at-a-time')).toBeGreaterThanOrEqual(created.data.waitedMs ?? 0);
      // Waits are gathered for a second before their request.waited is written (as refusals are):
      // usage counts them once written, and then agrees with what the rooms recorded.
      await waitFor('every wait journaled', async () => {
        const sums = await waitsIn('request.waited');
        return [...roomWaits].every(([tenant, ms]) => (sums.get(tenant) ?? 0) === ms);
      });
      const expected = [...told]
        .map(([tenant, t]) => ({ tenant, ...t, failed: 0, waitedMs: roomWaits.get(tenant) ?? 0 }))
        .sort((a, b) => (a.tenant < b.tenant ? -1 : 1));
      expect(expected.map((u) => [u.tenant, u.requests, u.refused])).toEqual([
        ['free', 1, 0],
        ['one-at-a-time', 3, 1],
        ['thrifty', 1, 1],
      ]);
      const route = (await (await call(s.url, '/v1/usage?since=1h')).json()) as Usage;
      expect(route.tenants).toEqual(expected);
      const overUrl = await pdctl(['usage', '--json', '--url', s.url]);
      expect(overUrl.code, overUrl.stderr).toBe(0);
      expect((JSON.parse(overUrl.stdout) as Usage).tenants).toEqual(expected);
      const one1 = await pdctl(['usage', '--url', s.url, '--tenant', 'thrifty']);
      expect(one1.stdout).toMatch(/TENANT\s+ANSWERED\s+REFUSED\s+FAILED/);
      expect(one1.stdout).toMatch(/^thrifty\s+1\s+1\s+0\s/m);
      expect(one1.stdout).not.toMatch(/one-at-a-time/);
      const metrics = await (await call(s.url, '/metrics')).text();
      const series = (name: string, labels: string) =>
        Number(new RegExp(`^${name}\\{${labels}\\} (\\S+)$`, 'm').exec(metrics)?.[1]);
      for (const u of expected) {
        const t = `tenant="${u.tenant}"`;
        expect(series('pdctl_tenant_requests_total', `${t},outcome="answered"`)).toBe(u.requests);
        expect(series('pdctl_tenant_requests_total', `${t},outcome="refused"`)).toBe(u.refused);
        expect(series('pdctl_tenant_tokens_total', `${t},kind="prompt"`)).toBe(u.promptTokens);
        expect(series('pdctl_tenant_tokens_total', `${t},kind="completion"`)).toBe(
          u.completionTokens,
        );
      }
      expect(await s.stop()).toBe(0);
      const journal = join(s.dataDir, 'journal.db');
      const file = await pdctl(['usage', '--json', '--since', '1h', '--journal', journal]);
      expect(file.code, file.stderr).toBe(0);
      expect((JSON.parse(file.stdout) as Usage).tenants).toEqual(expected);
      // A window that ends before the first request holds none of them.
      const before = await pdctl(['usage', '--json', '--until', '1h', '--journal', journal]);
      expect(JSON.parse(before.stdout)).toMatchObject({ tenants: [] });
      const backwards = await pdctl([
        'usage',
        '--since',
        '1h',
        '--until',
        '2h',
        '--journal',
        journal,
      ]);
      expect(backwards.code).toBe(2);
      expect(backwards.stderr).toMatch(/--until 2h is before --since 1h/);
      // Rooms retention pruned are read from its archive, with the same figures.
      const archive = join(tempDir('pdctl-usage-archive-'), 'archive');
      const pruned = await pdctl([
        'journal',
        'prune',
        '--older-than',
        '0s',
        '--events-older-than',
        '0s',
        '--archive',
        archive,
        '--journal',
        journal,
      ]);
      expect(pruned.code, pruned.stderr).toBe(0);
      const left = await pdctl(['usage', '--json', '--journal', journal]);
      expect(JSON.parse(left.stdout)).toMatchObject({ tenants: [] });
      const archived = await pdctl(['usage', '--json', '--archive', archive]);
      expect(archived.code, archived.stderr).toBe(0);
      expect((JSON.parse(archived.stdout) as Usage).tenants).toEqual(expected);
    } finally {
      await s.stop();
    }
  }, 60_000);
});

describe('flow control through pdctl serve', () => {
  it('requests past a full fleet wait in the queue, are served in turn, the planner reads them as demand, and SIGTERM sends what still waits elsewhere', async () => {
    // One room at a time on the one decode engine, 100 ms a token: the rest wait their turn.
    const s = await serve([
      ...['--max-rooms-per-engine', '1', '--decode-us-per-token', '100000'],
      ...['--planner', 'advise', '--planner-interval', '1s', '--canary-interval-ms', '0'],
    ]);
    try {
      const ask = (i: number) =>
        call(
          s.url,
          '/v1/completions',
          undefined,
          { model: MODEL, prompt: `the river ${i}`, max_tokens: 10 },
          { 'x-request-id': `turn-${i}` },
        );
      const first = ask(0);
      await waitFor('its room in flight', async () => {
        const live = (await (await call(s.url, '/v1/live')).json()) as { rooms: unknown[] };
        return live.rooms.length > 0;
      });
      const rest = [1, 2, 3].map(ask);
      await waitFor('three waiting', async () =>
        /pdctl_queue_waiting\{band="interactive"\} 3\b/.test(
          await (await call(s.url, '/metrics')).text(),
        ),
      );
      // The planner's next interval counts them: demand that has no room yet.
      await waitFor('a decision that read the queue', async () =>
        (await (await call(s.url, '/v1/journal?type=planner.decision')).text())
          .split('\n')
          .filter((l) => l !== '')
          .some(
            (l) =>
              ((JSON.parse(l) as { data: { inputs: { queued?: number } } }).data.inputs.queued ??
                0) > 0,
          ),
      );
      const answers = await Promise.all([first, ...rest]);
      for (const r of answers) expect(r.status).toBe(200);
      // Served in the order they came: each later one waited longer.
      const waited: number[] = [];
      for (const r of answers.slice(1)) {
        const room = r.headers.get('x-pdctl-room');
        const ev = (await (
          await call(s.url, `/v1/journal?type=room.created&room=${room}`)
        ).json()) as { data: { waitedMs: number } };
        waited.push(ev.data.waitedMs);
      }
      expect(waited[0]).toBeGreaterThan(0);
      expect([...waited].sort((a, b) => a - b)).toEqual(waited);

      // SIGTERM: the room in flight finishes; the request still waiting its turn is not started
      // during the drain but told to go elsewhere.
      const running = ask(4);
      await waitFor('its room in flight', async () => {
        const live = (await (await call(s.url, '/v1/live')).json()) as { rooms: unknown[] };
        return live.rooms.length > 0;
      });
      const queued = ask(5);
      await waitFor('one waiting', async () =>
        /pdctl_queue_waiting\{band="interactive"\} 1\b/.test(
          await (await call(s.url, '/metrics')).text(),
        ),
      );
      const stopped = s.stop();
      const told = await queued;
      expect(told.status).toBe(503);
      expect(((await told.json()) as { error: { message: string } }).error.message).toMatch(
        /shutting down: this request waited its turn and was not started/,
      );
      expect((await running).status).toBe(200);
      expect(await stopped).toBe(0);
    } finally {
      await s.stop();
    }
  }, 60_000);
});
