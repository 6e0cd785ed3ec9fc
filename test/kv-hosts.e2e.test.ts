/**
 * KV across hosts, the whole path: the control plane on test host c, a prefill engine on host a
 * and a decode engine on host b (each host its own network and /dev/shm; src/drills/hosts.ts).
 * Completions, streaming and not, are the model's own text, the journal says UCX moved every
 * room's KV, and neither engine's pool is visible on the other's host.
 */
import type { ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { newKeyPair } from '../src/bus/admission.ts';
import { TestHosts, testHostsUnavailable } from '../src/drills/hosts.ts';
import { DeterministicModel, generateInProcess } from '../src/model/deterministic.ts';
import { ucxBackend } from '../src/transfer/ucx.ts';
import { ROOT } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';
import { waitFor } from './helpers/wait.ts';

const why = testHostsUnavailable() ?? (ucxBackend().available ? null : ucxBackend().reason);

let hosts: TestHosts | null = null;
afterEach(() => {
  hosts?.destroy();
  hosts = null;
});

const HTTP_PORT = 18080;
const BUS_PORT = 15557;

function pdctlOn(h: TestHosts, host: string, args: string[], env: NodeJS.ProcessEnv): ChildProcess {
  const child = h.spawn(host, process.execPath, ['--import', 'tsx', 'src/cli/bin.ts', ...args], {
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
  it('control plane on c, prefill on a, decode on b: answers are the model’s, UCX moved the KV', async () => {
    hosts = await TestHosts.create({ names: ['a', 'b', 'c'], reach: ['c'] });
    const h = hosts;
    const data = tempDir('pdctl-kv-hosts-');
    const server = newKeyPair();
    writeFileSync(join(data, 'bus.key'), JSON.stringify(server), { mode: 0o600 });
    const keys = { 'prefill-a': newKeyPair(), 'decode-b': newKeyPair() };
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
      ],
      {},
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
    try {
      await waitFor(
        'both engines registered',
        async () => {
          const r = (await (await fetch(`${base}/v1/engines`)).json()) as { engines: unknown[] };
          return r.engines.length === 2;
        },
        30_000,
      );
    } catch (err) {
      throw new Error(
        `${(err as Error).message}\nserve: ${(serve as ChildProcess & { errText: () => string }).errText()}\n` +
          engines.map((e) => (e as ChildProcess & { errText: () => string }).errText()).join('\n'),
      );
    }
    // Each engine says where it runs: two hosts, and the decode engine receives over UCX.
    const listed = (
      (await (await fetch(`${base}/v1/engines`)).json()) as {
        engines: Array<{ id: string; host: string | null; kv_ucx: boolean }>;
      }
    ).engines.sort((x, y) => x.id.localeCompare(y.id));
    expect(listed.map((e) => [e.id, e.kv_ucx])).toEqual([
      ['decode-b', true],
      ['prefill-a', false],
    ]);
    expect(listed[0]?.host).toBeTruthy();
    expect(listed[0]?.host).not.toBe(listed[1]?.host);
    const model = new DeterministicModel();
    const prompts = Array.from({ length: 4 }, (_, i) => `the river runs north ${i} past the mill`);
    for (const prompt of prompts) {
      const res = await fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: model.name, prompt, max_tokens: 12 }),
      });
      const body = (await res.json()) as { choices: Array<{ text: string }> };
      expect(res.status, JSON.stringify(body)).toBe(200);
      expect(body.choices[0]?.text).toBe(generateInProcess(model, prompt, 12).text);
    }
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
    const journal = await (await fetch(`${base}/v1/journal?type=room.transfer_completed`)).text();
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
  }, 120_000);
});
