/**
 * Issue 40, item 6, played across test hosts: a peer on the KV network that holds a pdctl
 * receiver's UCX worker address (what every prefill engine paired with a decode engine is handed)
 * tries to write into that process's memory where no transfer offered it, and to read from it.
 * The victim is the UCX node a decode engine opens, with its pool in its own host's /dev/shm
 * (scripts/ucx-peer.ts, on host b); the attacker (./ucx-attacker.cc, built here with the system's
 * libucp) runs on host a with UCX's RMA feature, aiming at the victim's last pool page — no room's —
 * and at the victim's executable's ELF header, both found in /proc/PID/maps as a local attacker
 * or a leaked address would give them.
 *
 * With one-sided RMA (pdctl before protocol 8) both succeeded over TCP: the bytes landed and the
 * header came back. Now the node runs without RMA and publishes no key, and neither may happen.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { TestHosts, testHostsUnavailable } from '../../src/drills/hosts.ts';
import { ucxBackend } from '../../src/transfer/ucx.ts';
import { ROOT } from '../helpers/spawn.ts';
import { tempDir } from '../helpers/tmp.ts';
import { findTool, requireTool } from '../helpers/tools.ts';
import { firstLine, peerLines, spawnUcxPeer } from '../helpers/ucx-peer.ts';

const why = testHostsUnavailable() ?? (ucxBackend().available ? null : ucxBackend().reason);
const headers = findTool('ucp.h', ['/usr/include/ucp/api/ucp.h']);
const buildable = requireTool('ucx', headers, 'apt-get install libucx-dev');

let hosts: TestHosts | null = null;
afterEach(() => {
  hosts?.destroy();
  hosts = null;
});

/** The start address of the first mapping in /proc/PID/maps whose path matches. */
function mappingStart(pid: number, path: RegExp): bigint {
  const line = readFileSync(`/proc/${pid}/maps`, 'utf8')
    .split('\n')
    .find((l) => path.test(l));
  if (!line) throw new Error(`no mapping of ${path} in process ${pid}`);
  return BigInt(`0x${line.split('-')[0]}`);
}

describe.skipIf(why !== null || !buildable)(
  `a peer on the KV network${why ? ` (skipped: ${why})` : ''}`,
  () => {
    it('cannot write into a pdctl receiver’s memory, or read it, with its worker address', async () => {
      const dir = tempDir('pdctl-ucx-attack-');
      const attacker = join(dir, 'ucx-attacker');
      execFileSync('g++', [
        '-std=c++17',
        '-O1',
        '-o',
        attacker,
        join(ROOT, 'test/attacks/ucx-attacker.cc'),
        '-lucp',
        '-lucs',
      ]);
      hosts = await TestHosts.create({ names: ['a', 'b'] });
      const victim = spawnUcxPeer(hosts, 'b', 'a', 16, 4096);
      const lines = peerLines(victim);
      const ask = (cmd: string) => {
        victim.stdin?.write(`${cmd}\n`);
        return lines.next();
      };
      const first = await firstLine(victim, lines);
      const desc = JSON.parse(first) as { address: string; rkey?: string; pool: string };
      // The test host's pid namespace is this one's: its pid is the victim's own.
      const pid = victim.pid as number;
      const lastPage = mappingStart(pid, new RegExp(desc.pool)) + 4096n + 15n * 4096n;
      const elf = mappingStart(pid, /\/node$/);
      const before = await ask('checksum 15');

      // Whatever the victim published: its address, and a remote key only if it has one.
      const input = join(dir, 'victim.json');
      writeFileSync(input, JSON.stringify({ address: desc.address, rkey: desc.rkey ?? '' }));
      const run = await hosts.run('a', 'sh', [
        '-c',
        `UCX_TLS=tcp UCX_NET_DEVICES=${hosts.device('a', 'b')} ${attacker} ${lastPage} ${elf} 64 < ${input}`,
      ]);
      expect(run.code, run.stderr).toBe(0);
      const attempt = JSON.parse(run.stdout.trim().split('\n').at(-1) as string) as {
        rkey: string;
        put: string;
        get: string;
        read: string;
      };
      // Nothing landed in the page, and nothing of the victim's memory came back.
      expect(await ask('checksum 15')).toBe(before);
      expect(attempt.read.startsWith('7f454c46')).toBe(false);
      // It had no key of the victim's to try: there is none.
      expect(desc.rkey).toBeUndefined();
      expect(attempt.rkey).toBe('own');
      expect(attempt.put).not.toBe('OK');
      expect(attempt.get).not.toBe('OK');
      // The victim's UCX dropped the request: it has no handler for remote memory access.
      expect(lines.ucxLog.join('\n')).toMatch(/no handler installed/);
      // And the victim is still there, answering.
      expect(await ask('ls')).toContain(desc.pool.slice(1));
      victim.stdin?.write('exit\n');
    }, 60_000);
  },
);
