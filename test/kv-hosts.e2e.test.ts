/**
 * KV across hosts, the whole path: the control plane on test host c, a prefill engine on host a
 * and a decode engine on host b (each host its own network and /dev/shm; src/drills/hosts.ts).
 * Completions, streaming and not, are the model's own text, the journal says UCX moved every
 * room's KV, and neither engine's pool is visible on the other's host. Then a decode engine on
 * host a joins: rooms take the same-host pair (shared memory); a prefill engine on host b joins:
 * concurrent rooms spread over the two same-host pairs; and a decode engine on host b that
 * restarted (a new pool, registered again) receives over UCX what host a's cannot take.
 */
import type { ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { newKeyPair } from '../src/bus/admission.ts';
import { TestHosts, testHostsUnavailable } from '../src/drills/hosts.ts';
import { DeterministicModel, generateInProcess } from '../src/model/deterministic.ts';
import { ucxBackend } from '../src/transfer/ucx.ts';
import { PDCTL_BIN, ROOT } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';
import { waitFor } from './helpers/wait.ts';

const why = testHostsUnavailable() ?? (ucxBackend().available ? null : ucxBackend().reason);

let hosts: TestHosts | null = null;
afterEach(() => {
  hosts?.destroy();
  hosts = null;
});

const HTTP_PORT = 18080;
const ADMIN_TOKEN = 'kv-hosts-admin-token';
/** The query routes of a serve with an admin token need it. */
const asAdmin = { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } };
const BUS_PORT = 15557;

function pdctlOn(h: TestHosts, host: string, args: string[], env: NodeJS.ProcessEnv): ChildProcess {
  const child = h.spawn(host, process.execPath, [PDCTL_BIN, ...args], {
    cwd: ROOT,
    env: { ...process.env, ...env },
  });
  let err = '';
  child.stderr?.on('data', (d: Buffer) => {
    err += d.toString();
    if (err.length > 20_000) err = err.slice(-10_000);
  });
  child.stdout?.resume();
  (child as ChildProcess & { errText: () => string }).errText = () => err;
  return child;
}

describe.skipIf(why !== null)(`KV across test hosts${why ? ` (skipped: ${why})` : ''}`, () => {
  it('control plane on c, engines on a and b: answers are the model’s, UCX moves KV between hosts, same-host pairs first', async () => {
    hosts = await TestHosts.create({ names: ['a', 'b', 'c'], reach: ['c'] });
    const h = hosts;
    const data = tempDir('pdctl-kv-hosts-');
    const server = newKeyPair();
    writeFileSync(join(data, 'bus.key'), JSON.stringify(server), { mode: 0o600 });
    const keys = {
      'prefill-a': newKeyPair(),
      'decode-b': newKeyPair(),
      'decode-a': newKeyPair(),
      'prefill-b': newKeyPair(),
    };
    const serve = pdctlOn(
      h,
      'c',
      [
        'serve',
        '--host',
        '0.0.0.0',
        '--port',
        String(HTTP_PORT),
        '--bus',
        `tcp://0.0.0.0:${BUS_PORT}`,
        '--prefill',
        '0',
        '--decode',
        '0',
        '--data-dir',
        data,
        '--durability',
        'process',
        '--log-level',
        'warn',
        '--engine-key',
        `prefill-a=${keys['prefill-a'].publicKey}`,
        '--engine-key',
        `decode-b=${keys['decode-b'].publicKey}`,
        '--engine-key',
        `decode-a=${keys['decode-a'].publicKey}`,
        '--engine-key',
        `prefill-b=${keys['prefill-b'].publicKey}`,
      ],
      { PDCTL_ADMIN_TOKEN: ADMIN_TOKEN },
    );
    const base = `http://${h.address('c', 'self')}:${HTTP_PORT}`;
    await waitFor(
      'pdctl serve on host c',
      async () => (await fetch(`${base}/health`).catch(() => null))?.status === 200,
      30_000,
    );
    const engine = (
      host: 'a' | 'b',
      role: 'prefill' | 'decode',
      id: keyof typeof keys,
      peer: string,
    ) =>
      pdctlOn(
        h,
        host,
        [
          'engine',
          '--role',
          role,
          '--id',
          id,
          '--control',
          `tcp://${h.address('c', host)}:${BUS_PORT}`,
          '--kv-transport',
          'auto',
          // Rooms that last a few tens of ms, so that concurrent ones overlap.
          '--decode-us-per-token',
          '2000',
          '--log-level',
          'warn',
        ],
        {
          PDCTL_CURVE_SERVER_KEY: server.publicKey,
          PDCTL_CURVE_PUBLIC_KEY: keys[id].publicKey,
          PDCTL_CURVE_SECRET_KEY: keys[id].secretKey,
          UCX_TLS: 'tcp',
          // The interface of the link to the other engine's host (docs/development.md).
          UCX_NET_DEVICES: h.device(host, peer),
        },
      );
    const engines = [
      engine('a', 'prefill', 'prefill-a', 'b'),
      engine('b', 'decode', 'decode-b', 'a'),
    ];
    const listEngines = async () =>
      (
        (await (await fetch(`${base}/v1/engines`, asAdmin)).json()) as {
          engines: Array<{
            id: string;
            state: string;
            incarnation: string;
            host: string | null;
            kvUcx: boolean;
            transfers: Record<string, number>;
          }>;
        }
      ).engines.sort((x, y) => x.id.localeCompare(y.id));
    /** Waits until the engines serving (and not draining) are exactly `ids`. */
    const serving = async (what: string, ids: string[]) => {
      try {
        await waitFor(
          what,
          async () =>
            JSON.stringify(
              (await listEngines()).filter((e) => e.state === 'ready').map((e) => e.id),
            ) === JSON.stringify(ids),
          30_000,
        );
      } catch (err) {
        throw new Error(
          `${(err as Error).message}\nserve: ${(serve as ChildProcess & { errText: () => string }).errText()}\n` +
            engines
              .map((e) => (e as ChildProcess & { errText: () => string }).errText())
              .join('\n'),
        );
      }
    };
    await serving('both engines registered', ['decode-b', 'prefill-a']);
    // Each engine says where it runs: two hosts, and the decode engine receives over UCX.
    const listed = await listEngines();
    expect(listed.map((e) => [e.id, e.kvUcx])).toEqual([
      ['decode-b', true],
      ['prefill-a', false],
    ]);
    expect(listed[0]?.host).toBeTruthy();
    expect(listed[0]?.host).not.toBe(listed[1]?.host);
    const model = new DeterministicModel();
    /** Completes `prompt`, checks the text is the model's own, and says which pair served it. */
    const complete = async (prompt: string) => {
      const res = await fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: model.name, prompt, max_tokens: 12 }),
      });
      const body = (await res.json()) as { choices: Array<{ text: string }> };
      expect(res.status, JSON.stringify(body)).toBe(200);
      expect(body.choices[0]?.text).toBe(generateInProcess(model, prompt, 12).text);
      const room = res.headers.get('x-pdctl-room') as string;
      const { events } = (await (await fetch(`${base}/v1/rooms/${room}`, asAdmin)).json()) as {
        events: Array<{ type: string; data: { decodeEngine?: string; transport?: string } }>;
      };
      const created = events.find((e) => e.type === 'room.created')?.data;
      const moved = events.find((e) => e.type === 'room.transfer_completed')?.data;
      return [created?.decodeEngine, created?.transport, moved?.transport];
    };
    const prompts = Array.from({ length: 4 }, (_, i) => `the river runs north ${i} past the mill`);
    for (const prompt of prompts)
      expect(await complete(prompt)).toEqual(['decode-b', 'ucx', 'ucx']);
    const streamed = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: model.name, prompt: prompts[0], max_tokens: 12, stream: true }),
    });
    const text = (await streamed.text())
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map(
        (e) =>
          (JSON.parse(e.slice(6)) as { choices: Array<{ text: string }> }).choices[0]?.text ?? '',
      )
      .join('');
    expect(text).toBe(generateInProcess(model, prompts[0] as string, 12).text);

    // The journal says what moved the bytes.
    const journal = await (
      await fetch(`${base}/v1/journal?type=room.transfer_completed`, asAdmin)
    ).text();
    const transports = journal
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { data: { transport?: string } }).data.transport);
    expect(transports.length).toBeGreaterThanOrEqual(5);
    expect(new Set(transports)).toEqual(new Set(['ucx']));

    // Each engine's pool is in its own host's /dev/shm, and only there.
    const onA = (await h.run('a', 'ls', ['/dev/shm'])).stdout;
    const onB = (await h.run('b', 'ls', ['/dev/shm'])).stdout;
    expect(onA).toMatch(/pdctl-prefill-a-/);
    expect(onA).not.toMatch(/pdctl-decode-b-/);
    expect(onB).toMatch(/pdctl-decode-b-/);
    expect(onB).not.toMatch(/pdctl-prefill-a-/);

    // A decode engine on host a joins: the same-host pair costs less, its KV moves in memory.
    engines.push(engine('a', 'decode', 'decode-a', 'b'));
    await serving('decode-a registered', ['decode-a', 'decode-b', 'prefill-a']);
    for (const prompt of prompts.slice(0, 3))
      expect(await complete(prompt)).toEqual(['decode-a', 'shm', 'shm']);
    const tally = Object.fromEntries((await listEngines()).map((e) => [e.id, e.transfers]));
    expect(Object.keys(tally['decode-a'] ?? {})).toEqual(['shm']);
    expect(Object.keys(tally['decode-b'] ?? {})).toEqual(['ucx']);
    expect(tally['prefill-a']?.ucx).toBeGreaterThanOrEqual(5);
    expect(tally['prefill-a']?.shm).toBeGreaterThanOrEqual(3);
    const metrics = await (await fetch(`${base}/metrics`)).text();
    const count = (transport: string) =>
      Number(
        metrics.match(
          new RegExp(
            `^pdctl_transfers_total\\{status="ok",transport="${transport}"\\} (\\d+)$`,
            'm',
          ),
        )?.[1] ?? 0,
      );
    expect(count('ucx')).toBeGreaterThanOrEqual(5);
    expect(count('shm')).toBeGreaterThanOrEqual(3);
    // The CLI reads a serve with an admin token as operators do: with PDCTL_ADMIN_TOKEN.
    const table = await h.run('c', 'env', [
      `PDCTL_ADMIN_TOKEN=${ADMIN_TOKEN}`,
      ...[process.execPath, PDCTL_BIN, 'engines', '--url', base],
    ]);
    expect(table.code, table.stderr).toBe(0);
    expect(table.stdout).toMatch(/TRANSFERS/);
    expect(table.stdout).toMatch(/decode-b .*\bucx:\d+/);
    expect(table.stdout).toMatch(/prefill-a .*\bucx:\d+ shm:\d+|prefill-a .*\bshm:\d+ ucx:\d+/);

    // Both roles on both hosts: concurrent rooms spread over the two same-host pairs, and none
    // moves its KV over UCX while a same-host pair has room.
    engines.push(engine('b', 'prefill', 'prefill-b', 'a'));
    await serving('prefill-b registered', ['decode-a', 'decode-b', 'prefill-a', 'prefill-b']);
    const pairs = await Promise.all(
      prompts.map(async (prompt) => {
        const res = await fetch(`${base}/v1/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: model.name, prompt, max_tokens: 12 }),
        });
        const body = (await res.json()) as { choices: Array<{ text: string }> };
        expect(body.choices[0]?.text).toBe(generateInProcess(model, prompt, 12).text);
        const room = res.headers.get('x-pdctl-room') as string;
        const { events } = (await (await fetch(`${base}/v1/rooms/${room}`, asAdmin)).json()) as {
          events: Array<{ type: string; data: Record<string, string> }>;
        };
        const created = events.find((e) => e.type === 'room.created')?.data ?? {};
        return `${created.prefillEngine}→${created.decodeEngine} ${created.transport}`;
      }),
    );
    expect(new Set(pairs)).toEqual(new Set(['prefill-a→decode-a shm', 'prefill-b→decode-b shm']));

    // decode-b restarts (a new pool, registered again), decode-a and prefill-b drain: rooms go
    // from prefill-a to the new decode-b over UCX, into the pool it registered this time.
    const before = (await listEngines()).find((e) => e.id === 'decode-b')?.incarnation;
    const old = engines[1] as ChildProcess;
    process.kill(-(old.pid as number), 'SIGKILL');
    engines[1] = engine('b', 'decode', 'decode-b', 'a');
    for (const id of ['decode-a', 'prefill-b']) {
      const drain = await fetch(`${base}/v1/admin/engines/${id}/commands`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${ADMIN_TOKEN}` },
        body: JSON.stringify({ command: 'drain', reason: 'kv-hosts test' }),
      });
      expect(drain.status).toBe(202);
    }
    await waitFor(
      'decode-b back as a new incarnation',
      async () => {
        const d = (await listEngines()).find((e) => e.id === 'decode-b');
        return d?.state === 'ready' && d.incarnation !== before;
      },
      30_000,
    );
    await serving('decode-a and prefill-b draining', ['decode-b', 'prefill-a']);
    for (const prompt of prompts.slice(0, 2))
      expect(await complete(prompt)).toEqual(['decode-b', 'ucx', 'ucx']);
  }, 120_000);
});
