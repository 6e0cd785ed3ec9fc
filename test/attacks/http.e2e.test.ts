/**
 * The attacks at the HTTP port of a real `pdctl serve`: a prompt too large for the bus, slow
 * bodies holding connections, cross-site POSTs to admin routes.
 */
import { request } from 'node:http';
import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Served, serve } from '../helpers/serve.ts';

let s: Served;
beforeAll(async () => {
  s = await serve([
    '--request-timeout-ms',
    '1000',
    '--max-connections',
    '32',
    '--canary-interval-ms',
    '0',
  ]);
}, 60_000);
afterAll(async () => {
  await s?.stop();
});

async function post(path: string, body: string, headers: Record<string, string> = {}) {
  const res = await fetch(`${s.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body,
  });
  return { status: res.status, body: (await res.json()) as { error?: { message: string } } };
}

async function roomCount(): Promise<number> {
  const res = await fetch(`${s.url}/v1/stats`);
  return ((await res.json()) as { journal: { rooms: number } }).journal.rooms;
}

describe('attacks at the HTTP port', () => {
  it('a prompt that cannot fit in a bus frame is a 400 that names the limit, and journals nothing', async () => {
    const before = await roomCount();
    // 1,045,000 bytes: under the 1 MiB body limit, over what a room.created event can carry.
    const prompt = 'ab '.repeat(348_334).slice(0, 1_045_000);
    const res = await post(
      '/v1/completions',
      JSON.stringify({ model: 'pdctl-deterministic-1', prompt, max_tokens: 4 }),
    );
    expect(res.status).toBe(400);
    expect(res.body.error?.message).toMatch(
      /prompt is 1045000 bytes .*the most an engine can be sent is 1040384 bytes/,
    );
    expect(await roomCount()).toBe(before);
    // The stack still serves, with no engine reset for it.
    const ok = await post(
      '/v1/completions',
      JSON.stringify({ model: 'pdctl-deterministic-1', prompt: 'the river', max_tokens: 4 }),
    );
    expect(ok.status).toBe(200);
  });

  it('cuts off clients that trickle their bodies, and caps open connections', async () => {
    const sockets: Socket[] = [];
    const closed: Array<Promise<number>> = [];
    const { port } = new URL(s.url);
    const t0 = Date.now();
    for (let i = 0; i < 48; i++) {
      const sock = connect(Number(port), '127.0.0.1');
      sock.on('error', () => {});
      sock.on('data', () => {});
      sockets.push(sock);
      closed.push(new Promise((r) => sock.once('close', () => r(Date.now() - t0))));
      sock.write(
        'POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{',
      );
    }
    // One byte every 200 ms: a body that would take 200 s to arrive.
    const drip = setInterval(() => {
      for (const sock of sockets) if (!sock.destroyed) sock.write(' ');
    }, 200);
    try {
      const times = (await Promise.all(closed)).sort((a, b) => a - b);
      // 16 over the cap of 32 are closed as they arrive, long before any request timeout.
      expect(times[15]).toBeLessThan(900);
      // Every one is gone within the 1 s request timeout plus node's 1 s check and some slack.
      expect(times[times.length - 1]).toBeLessThan(5000);
    } finally {
      clearInterval(drip);
      for (const sock of sockets) sock.destroy();
    }
    const ok = await post(
      '/v1/completions',
      JSON.stringify({ model: 'pdctl-deterministic-1', prompt: 'the river', max_tokens: 4 }),
    );
    expect(ok.status).toBe(200);
  });

  it('admin routes refuse a foreign Origin and bodies that are not JSON', async () => {
    const before = await roomCount();
    const abort = '/v1/rooms/r-target-1/abort';
    const foreign = await post(abort, '{}', { origin: 'http://evil.example' });
    expect(foreign.status).toBe(403);
    expect(foreign.body.error?.message).toContain('another origin');
    for (const type of ['text/plain', 'application/x-www-form-urlencoded']) {
      const res = await post(abort, 'reason=x', { 'content-type': type });
      expect(res.status, type).toBe(415);
      expect(res.body.error?.message).toContain('JSON body');
    }
    const commands = await post('/v1/admin/engines/decode-0/commands', '{"command":"drain"}', {
      origin: 'null',
    });
    expect(commands.status).toBe(403);
    // Same origin, JSON: it reaches the route (no such room).
    const same = await post(abort, '{}', { origin: s.url });
    expect(same.status).toBe(404);
    expect(await roomCount()).toBe(before);
    const engines = (await (await fetch(`${s.url}/v1/engines`)).json()) as {
      engines: Array<{ id: string; state?: string }>;
    };
    expect(engines.engines.map((e) => e.id).sort()).toEqual(['decode-0', 'prefill-0']);
  });
});

/** A POST with the Host and Origin a DNS-rebinding page would send (fetch cannot set Host). */
function rawPost(
  url: string,
  path: string,
  headers: Record<string, string>,
): Promise<{ status: number; body: { error?: { code: string | null } } }> {
  const { port } = new URL(url);
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        path,
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
      },
      (res) => {
        let text = '';
        res.on('data', (d: Buffer) => (text += d.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) }));
      },
    );
    req.on('error', reject);
    req.end('{"command":"drain"}');
  });
}

describe('a web page against loopback admin routes (no token set)', () => {
  it('DNS rebinding: a foreign Host, or a foreign Origin with a loopback Host, is refused; the engine keeps serving', async () => {
    const port = new URL(s.url).port;
    const drain = '/v1/admin/engines/decode-0/commands';
    const rebound = await rawPost(s.url, drain, {
      host: `rebind.attacker.example:${port}`,
      origin: `http://rebind.attacker.example:${port}`,
    });
    expect(rebound.status).toBe(403);
    expect(rebound.body.error?.code).toBe('foreign_host');
    const origin = await rawPost(s.url, drain, {
      host: `localhost:${port}`,
      origin: `http://rebind.attacker.example:${port}`,
    });
    expect(origin.status).toBe(403);
    expect(origin.body.error?.code).toBe('cross_origin');
    // A loopback name of another port is another server.
    const other = await rawPost(s.url, drain, { host: 'localhost:1' });
    expect(other.status).toBe(403);
    // Addressed by a loopback name of this server, it reaches the route (a room that is not there).
    const ours = await rawPost(s.url, '/v1/rooms/r-none-1/abort', {
      host: `localhost:${port}`,
      origin: `http://localhost:${port}`,
    });
    expect(ours.status).toBe(404);
    const ok = await post(
      '/v1/completions',
      JSON.stringify({ model: 'pdctl-deterministic-1', prompt: 'the river', max_tokens: 4 }),
    );
    expect(ok.status).toBe(200);
  });
});

describe('/health/deep as a weapon', () => {
  it('client canaries never count against an engine: failing ones change nothing; short deadlines and bursts refused', async () => {
    // Each token takes 400 ms of the decode engine's (simulated) device: a 250 ms canary fails in
    // decode, the background one (2 s deadline) passes. On the device, not spun: a bus loop held
    // 400 ms by the CPU is one the watchdog rightly takes for wedged (busFrozenMs 500).
    const slow = await serve(['--decode-us-per-token', '400000', '--decode-compute', 'device']);
    try {
      const deep = (q: string) => fetch(`${slow.url}/health/deep${q}`);
      const short = await deep('?deadline_ms=10');
      expect(short.status).toBe(400);
      expect(((await short.json()) as { error: { message: string } }).error.message).toMatch(
        /from 250 to 60000/,
      );
      let failed = 0;
      let limited = 0;
      for (let round = 0; round < 5; round++) {
        // Concurrent callers share one canary; one right after it is told to wait.
        const shared = await Promise.all([1, 2, 3].map(() => deep('?deadline_ms=250')));
        const after = await deep('?deadline_ms=250');
        for (const r of [...shared, after]) {
          if (r.status === 503) failed++;
          if (r.status === 429) {
            limited++;
            expect(r.headers.get('retry-after')).toBe('1');
          }
        }
        await new Promise((r) => setTimeout(r, 1100));
      }
      expect(failed).toBeGreaterThanOrEqual(15);
      expect(limited).toBeGreaterThanOrEqual(4);
      // Fifteen failing canaries later: no recovery action, no restart, and ready.
      const actions = await (await fetch(`${slow.url}/v1/journal?type=recovery.action`)).text();
      expect(actions.trim()).toBe('');
      const engines = (await (await fetch(`${slow.url}/v1/engines`)).json()) as {
        engines: Array<{ id: string; restarts: number | null }>;
      };
      expect(engines.engines.map((e) => e.restarts)).toEqual([0, 0]);
      const ready = await fetch(`${slow.url}/health/ready`);
      expect(ready.status, await ready.text()).toBe(200);
    } finally {
      await slow.stop();
    }
  }, 60_000);
});
