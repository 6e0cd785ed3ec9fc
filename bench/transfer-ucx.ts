/**
 * `npm run bench:transfer -- --transport ucx`: the UCX backend between two test hosts (network
 * namespaces joined by a veth pair, src/drills/hosts.ts) against `ucx_perftest` between the same
 * two hosts, interleaved in one run: bandwidth for 64 KiB and 1 MiB pages against its matching
 * two-sided test (`tag_sync_bw`: synchronous tagged sends, as pdctl's), and the latency of one
 * 64 KiB page against `tag_sync_lat`. Both run with the UCX settings pdctl's addon sets
 * (UCX_TCP_PUT_ENABLE=n). The receiver (scripts/ucx-peer.ts) runs on host b and posts the
 * receives, the sender (bench/ucx-sender.ts) on host a. Needs root, `ip`, UCX and ucx_perftest
 * (Debian `ucx-utils`).
 */
import type { ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { TestHosts, testHostsUnavailable } from '../src/drills/hosts.ts';
import { ucxBackend } from '../src/transfer/ucx.ts';
import { asJson, say } from './args.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const POOL_BYTES = 64 * 2 ** 20;
const BYTES_PER_MEASUREMENT = 512 * 2 ** 20;
const ROUNDS = 3;
const LATENCY_TRANSFERS = 2000;
/** Transfers in flight in the bandwidth measurement, each a slice of the pool (bench/ucx-sender.ts). */
const SLICES = 16;
/** Each transfer's message: a room of 64 pages of 64 KiB, or 4 of 1 MiB. */
const MESSAGE_BYTES = POOL_BYTES / SLICES;
/** ucx_perftest's MB is 2^20 bytes; GB/s here is 10^9 bytes a second, as in the shm table. */
const PERFTEST_MB = 2 ** 20;

interface UcxRow {
  pageBytes: number;
  gbPerSec: number;
  perftestGbPerSec: number;
  ratio: number;
  rounds: { pdctl: number[]; perftest: number[] };
}

export async function ucxBenchmark(): Promise<void> {
  const why =
    testHostsUnavailable() ??
    (ucxBackend().available ? null : `UCX: ${ucxBackend().reason}`) ??
    (await perftestMissing());
  if (why) {
    process.stderr.write(`bench:transfer --transport ucx needs two test hosts and UCX: ${why}\n`);
    process.exit(1);
  }
  say('making test hosts a and b (network namespaces with their own /dev/shm)');
  const hosts = await TestHosts.create({ names: ['a', 'b'] });
  const stop = () => {
    hosts.destroy();
    process.exit(130);
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  const env = (host: 'a' | 'b') => ({
    ...process.env,
    UCX_TLS: process.env.UCX_TLS ?? 'tcp',
    UCX_TCP_PUT_ENABLE: 'n',
    UCX_NET_DEVICES: hosts.device(host, host === 'a' ? 'b' : 'a'),
  });
  const rows: UcxRow[] = [];
  let latency: { p50Micros: number; p99Micros: number; perftestP50Micros: number } | null = null;
  try {
    for (const pageBytes of [65536, 1 << 20]) {
      const pages = POOL_BYTES / pageBytes;
      const receiver = hosts.spawn(
        'b',
        process.execPath,
        ['--import', 'tsx', 'scripts/ucx-peer.ts', String(pages), String(pageBytes)],
        { cwd: ROOT, env: env('b'), stdio: ['pipe', 'pipe', 'pipe'] },
      );
      const fromReceiver = lines(receiver);
      const descriptor = await fromReceiver();
      const sender = hosts.spawn(
        'a',
        process.execPath,
        ['--import', 'tsx', 'bench/ucx-sender.ts'],
        {
          cwd: ROOT,
          env: env('a'),
          stdio: ['pipe', 'pipe', 'pipe'],
        },
      );
      const fromSender = lines(sender);
      sender.stdin?.write(`${descriptor}\n`);
      const ask = async <T>(cmd: string): Promise<T> => {
        sender.stdin?.write(`${cmd}\n`);
        let timer: NodeJS.Timeout | undefined;
        const late = new Promise<never>((_, reject) => {
          timer = setTimeout(
            () => reject(new Error(`the sender did not answer "${cmd}" within 120 s`)),
            120_000,
          );
        });
        try {
          return JSON.parse(await Promise.race([fromSender(), late])) as T;
        } finally {
          clearTimeout(timer);
        }
      };
      const ours: number[] = [];
      const theirs: number[] = [];
      const iterations = BYTES_PER_MEASUREMENT / MESSAGE_BYTES;
      for (let round = 0; round < ROUNDS; round++) {
        say(
          `${pageBytes / 1024} KiB pages, round ${round + 1}/${ROUNDS}: ucx_perftest, then pdctl`,
        );
        // The matching test: synchronous tagged messages of the same size as pdctl's (a slice).
        const p = await perftest(hosts, env, 'tag_sync_bw', MESSAGE_BYTES, iterations);
        theirs.push((p.bandwidthMBps * PERFTEST_MB) / 1e9);
        // The receiver posts every round's receives first, as a decode engine does at bootstrap.
        receiver.stdin?.write(
          `rounds ${BYTES_PER_MEASUREMENT / POOL_BYTES} ${SLICES} ${pages / SLICES}\n`,
        );
        ours.push((await ask<{ gbPerSec: number }>(`bw ${BYTES_PER_MEASUREMENT}`)).gbPerSec);
        expectLine(await fromReceiver(), 'rounds done');
      }
      const gbPerSec = median(ours);
      const perftestGbPerSec = median(theirs);
      rows.push({
        pageBytes,
        gbPerSec: round2(gbPerSec),
        perftestGbPerSec: round2(perftestGbPerSec),
        ratio: round2(gbPerSec / perftestGbPerSec),
        rounds: { pdctl: ours.map(round2), perftest: theirs.map(round2) },
      });
      if (pageBytes === 65536) {
        say(`single 64 KiB page latency: ${LATENCY_TRANSFERS} transfers each`);
        const p = await perftest(hosts, env, 'tag_sync_lat', pageBytes, LATENCY_TRANSFERS);
        say(`ucx_perftest tag_sync_lat p50 ${p.p50Micros} µs; now pdctl`);
        receiver.stdin?.write(`singles ${LATENCY_TRANSFERS}\n`);
        const o = await ask<{ p50Micros: number; p99Micros: number }>(`lat ${LATENCY_TRANSFERS}`);
        expectLine(await fromReceiver(), 'singles done');
        latency = {
          p50Micros: round2(o.p50Micros),
          p99Micros: round2(o.p99Micros),
          perftestP50Micros: round2(p.p50Micros),
        };
      }
      sender.stdin?.end('exit\n');
      receiver.stdin?.end('exit\n');
      await Promise.all([exited(sender), exited(receiver)]);
    }
  } finally {
    hosts.destroy();
  }
  const result = {
    transport: 'ucx',
    ucxTls: process.env.UCX_TLS ?? 'tcp',
    bytesPerMeasurement: BYTES_PER_MEASUREMENT,
    throughput: rows,
    singlePageLatency: latency,
  };
  if (asJson) {
    process.stdout.write(`${JSON.stringify(result)}\n`);
    return;
  }
  const size = (b: number) => (b >= 2 ** 20 ? `${b / 2 ** 20} MiB` : `${b / 1024} KiB`);
  const out = [
    `pdctl transfer benchmark, UCX (UCX_TLS=${result.ucxTls}) from test host a to test host b — ${BYTES_PER_MEASUREMENT / 2 ** 20} MiB per measurement in ${size(MESSAGE_BYTES)} rooms (${SLICES} in flight, the receiver's pages scattered), median of ${ROUNDS} interleaved rounds`,
    '',
    `| page size | pdctl UCX GB/s | ucx_perftest tag_sync_bw GB/s (${size(MESSAGE_BYTES)} messages) | ratio | rounds (pdctl / perftest) |`,
    '|---:|---:|---:|---:|---|',
    ...rows.map(
      (r) =>
        `| ${size(r.pageBytes)} | ${r.gbPerSec} | ${r.perftestGbPerSec} | ${r.ratio.toFixed(2)} | ${r.rounds.pdctl.join(', ')} / ${r.rounds.perftest.join(', ')} |`,
    ),
    '',
    latency
      ? `single 64 KiB page, post → completion (a synchronous send: matched by the receiver, a round trip): p50 ${latency.p50Micros} µs, p99 ${latency.p99Micros} µs; ucx_perftest tag_sync_lat p50 ${latency.perftestP50Micros} µs (half a round trip)`
      : '',
  ];
  process.stdout.write(`${out.join('\n')}\n`);
}

/** Runs ucx_perftest's server on b and its client on a; the client's `Final:` figures. */
async function perftest(
  hosts: TestHosts,
  env: (h: 'a' | 'b') => NodeJS.ProcessEnv,
  test: 'tag_sync_bw' | 'tag_sync_lat',
  size: number,
  iterations: number,
): Promise<{ p50Micros: number; bandwidthMBps: number }> {
  let last = '';
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = String(20_000 + Math.floor(Math.random() * 30_000));
    const server = hosts.spawn('b', 'ucx_perftest', ['-p', port], { env: env('b') });
    server.stdout?.resume();
    server.stderr?.resume();
    // The server needs a moment to listen; a client that comes too early is tried again.
    await new Promise((r) => setTimeout(r, 300 + attempt * 300));
    // `timeout`: a client whose server never answers is ended, and tried again.
    const client = await hosts.run('a', 'timeout', [
      '60',
      'env',
      `UCX_TLS=${env('a').UCX_TLS}`,
      `UCX_NET_DEVICES=${env('a').UCX_NET_DEVICES}`,
      'UCX_TCP_PUT_ENABLE=n',
      'ucx_perftest',
      hosts.address('b', 'a'),
      '-p',
      port,
      '-t',
      test,
      '-s',
      String(size),
      '-n',
      String(iterations),
    ]);
    try {
      process.kill(-(server.pid as number), 'SIGKILL');
    } catch {
      // it finished with the client
    }
    const final = client.stdout.split('\n').find((l) => l.startsWith('Final:'));
    if (client.code === 0 && final) {
      // Final: iterations, overhead 50%ile/average/overall (µs), bandwidth average/overall (MB/s), …
      const f = final.trim().split(/\s+/).slice(1).map(Number);
      return { p50Micros: f[1] as number, bandwidthMBps: f[5] as number };
    }
    last = `${client.stdout}${client.stderr}`.trim().split('\n').slice(-3).join(' | ');
    say(`ucx_perftest ${test} failed (exit ${client.code}), trying again: ${last}`);
  }
  throw new Error(`ucx_perftest ${test} did not run: ${last}`);
}

async function perftestMissing(): Promise<string | null> {
  const { spawnSync } = await import('node:child_process');
  const r = spawnSync('ucx_perftest', ['-h'], { stdio: 'ignore' });
  return r.error ? 'ucx_perftest not found (Debian: apt-get install ucx-utils)' : null;
}

function lines(child: ChildProcess): () => Promise<string> {
  const queue: string[] = [];
  const waiting: Array<{ ok: (l: string) => void; fail: (e: Error) => void }> = [];
  let buf = '';
  let err = '';
  child.stderr?.on('data', (d: Buffer) => {
    err = (err + d.toString()).slice(-4000);
  });
  child.stdout?.on('data', (d: Buffer) => {
    buf += d.toString();
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      const l = buf.slice(0, i);
      buf = buf.slice(i + 1);
      const w = waiting.shift();
      if (w) w.ok(l);
      else queue.push(l);
    }
  });
  child.once('exit', (code) => {
    for (const w of waiting.splice(0)) w.fail(new Error(`exited ${code}: ${err.trim()}`));
  });
  return () => {
    const l = queue.shift();
    if (l !== undefined) return Promise.resolve(l);
    if (child.exitCode !== null)
      return Promise.reject(new Error(`exited ${child.exitCode}: ${err.trim()}`));
    return new Promise((ok, fail) => waiting.push({ ok, fail }));
  };
}

function expectLine(line: string, want: string): void {
  if (line !== want) throw new Error(`the receiver said "${line}", not "${want}"`);
}

function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return Promise.resolve();
  return new Promise((r) => child.once('exit', () => r()));
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
}

function round2(x: number): number {
  return Math.round(x * 100) / 100;
}
