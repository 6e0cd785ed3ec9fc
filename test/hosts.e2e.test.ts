/**
 * Test hosts (src/drills/hosts.ts): namespaces that stand in for machines. What the cross-host
 * tests and drills rely on is checked here on its own: each host's /dev/shm is its own, hosts
 * reach each other only over their links, a link set down is a partition of that pair alone, and
 * nothing is left behind.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { TestHosts, testHostsUnavailable } from '../src/drills/hosts.ts';
import { requireTool } from './helpers/tools.ts';

const unavailable = testHostsUnavailable();
requireTool('netns', unavailable === null ? 'ip netns' : null, unavailable ?? '');

let hosts: TestHosts | null = null;
afterEach(() => {
  hosts?.destroy();
  hosts = null;
});

/** A node one-liner: connect to HOST:PORT, print what it says, or the error, within 1.5 s. */
const DIAL = `
const s = require('net').connect({ host: process.argv[1], port: Number(process.argv[2]) });
s.setTimeout(1500, () => { console.log('timeout'); process.exit(0); });
s.on('data', (d) => { console.log(d.toString()); process.exit(0); });
s.on('error', (e) => { console.log(e.code); process.exit(0); });`;

const SERVE = `
require('net').createServer((c) => c.end(process.argv[1])).listen(7000, '0.0.0.0', () => console.log('up'));`;

describe.skipIf(unavailable !== null)('test hosts', () => {
  it('keep /dev/shm private per host, connect over their own links, and partition one pair', async () => {
    hosts = await TestHosts.create({ names: ['a', 'b', 'c'], reach: ['c'] });
    const h = hosts;
    const node = process.execPath;
    // Shared memory: a file made on a is on neither b nor this machine.
    const marker = `pdctl-hosts-test-${process.pid}`;
    expect((await h.run('a', 'sh', ['-c', `echo x > /dev/shm/${marker}`])).code).toBe(0);
    expect((await h.run('a', 'ls', ['/dev/shm'])).stdout).toContain(marker);
    expect((await h.run('b', 'ls', ['/dev/shm'])).stdout).not.toContain(marker);
    expect(existsSync(`/dev/shm/${marker}`)).toBe(false);

    const server = h.spawn('b', node, ['-e', SERVE, 'hello from b']);
    await new Promise<void>((resolve, reject) => {
      server.stdout?.on('data', (d: Buffer) => d.toString().includes('up') && resolve());
      server.once('exit', (code) => reject(new Error(`server on b exited ${code}`)));
    });
    const dial = async (from: string, addr: string) =>
      (await h.run(from, node, ['-e', DIAL, addr, '7000'])).stdout.trim();
    const bForA = h.address('b', 'a');
    expect(await dial('a', bForA)).toBe('hello from b');
    expect(await dial('c', h.address('b', 'c'))).toBe('hello from b');
    // b's address on its link to a is not on any of c's links.
    expect(await dial('c', bForA)).toMatch(/ENETUNREACH|EHOSTUNREACH|timeout/);

    // The a–b link down: a cannot reach b; c still can, and a still reaches c.
    await h.setLink('a', 'b', false);
    expect(await dial('a', bForA)).toMatch(/ENETUNREACH|EHOSTUNREACH|timeout/);
    expect(await dial('c', h.address('b', 'c'))).toBe('hello from b');
    await h.setLink('a', 'b', true);
    expect(await dial('a', bForA)).toBe('hello from b');

    // This process reaches c (and only c) over its own link.
    expect(h.address('c', 'self')).toMatch(/^198\.19\./);
  }, 60_000);

  it('destroy kills every process started on the hosts and removes their namespaces', async () => {
    hosts = await TestHosts.create({ names: ['x', 'y'] });
    const sleeper = hosts.spawn('x', 'sleep', ['600']);
    const pid = sleeper.pid as number;
    const before = execFileSync('ip', ['netns', 'list']).toString();
    const ours = before.split('\n').filter((l) => l.includes(`pdctl-${process.pid}-`));
    expect(ours.length).toBeGreaterThanOrEqual(2);
    const exited = new Promise((r) => sleeper.once('exit', r));
    hosts.destroy();
    await exited;
    expect(existsSync(`/proc/${pid}`)).toBe(false);
    const after = execFileSync('ip', ['netns', 'list']).toString();
    for (const l of ours) expect(after).not.toContain(l.split(' ')[0]);
    expect(readdirSync('/dev/shm').filter((f) => f.startsWith('pdctl-shm'))).toEqual([]);
  });
});
