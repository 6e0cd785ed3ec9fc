/**
 * Every option of `pdctl serve`, `engine`, `journal prune` and `drill`, read from the commands
 * themselves, has a row here: the value given on the command line (and by its environment
 * variable, where it has one) is shown reaching the part it configures, by what that part then
 * does or reports through pdctl's own front doors (HTTP, the engines it starts, its log lines).
 * An option with no row fails the first test, so a flag that parses and is never read cannot slip
 * in again (`serve --archive` once did, and every test passed). A row proven by a test of another
 * file (one that runs anyway: the failover of a PostgreSQL journal, a llama.cpp model) names it,
 * and that it is still there is checked. A row not proven yet is a `todo` saying what would
 * prove it: listed, never counted as passing.
 */
import type { ChildProcess } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import type { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { newKeyPair } from '../src/bus/admission.ts';
import { buildProgram } from '../src/cli/main.ts';
import { oldJournal, roomIds } from './helpers/old-journal.ts';
import { complete, startServe } from './helpers/serve.ts';
import { pdctl, spawnPdctl } from './helpers/spawn.ts';
import { prompt, waitFor } from './helpers/stack.ts';
import { tempDir } from './helpers/tmp.ts';

type Proof = { test: string } | { file: string; test: string } | { todo: string };

/** The options a command parses: its long flag and its environment variable. */
function optionsOf(path: string[]): Array<{ flag: string; env: string | null }> {
  let c: Command | undefined = buildProgram();
  for (const name of path) c = c?.commands.find((x) => x.name() === name);
  if (!c) throw new Error(`no command ${path.join(' ')}`);
  return c.options.map((o) => ({ flag: o.long as string, env: o.envVar ?? null }));
}

const WIDE = 'serve: the wide run';
const ENV = 'serve: every environment variable';
const EXITS = 'serve: flags that refuse to start where they cannot hold';
const BY_HAND = 'engine: two engines started by hand against a serve';
const ENGINE_EXITS = 'engine: flags that refuse to start where they cannot hold';
const DRILL = 'drill: malformed-frames, quick, with its report';
const DRILL_EXITS = 'drill: flags that refuse to start where they cannot hold';
const DRILL_TARGETS = 'drill: a timing target held to another figure, counted only when strict';
const WEIGHED = 'serve: routing by prefix, weighed against queues';
const PRUNE = 'journal prune: on a stopped journal';
const PRUNE_URL = 'journal prune --url: on a serving one';
/** Rows proven by tests of other files. */
const PG = 'test/postgres.e2e.test.ts';
const LLAMA_SERVE = 'test/llama/serve.e2e.test.ts';
const LLAMA_ROOMS = 'test/llama/rooms.e2e.test.ts';
const DRILLS = 'test/drill.e2e.test.ts';
const BAD_ENGINE_OFF =
  'bad-engine --no-outlier-ejection --retry-limit 0: the corrupting engine stays in rotation, no failed room is tried again, and the drill says so';
/** What llama.cpp reports it gave the engines serve started with a tiny GGUF model. */
const RUNTIME =
  'runs its engines’ model as --context-size, --threads and --gpu say, as llama.cpp reports it';
const GPU_TODO =
  'auto and cpu run alike without a GPU; `npm run gpu-check` on a GPU host runs the llama tests with auto, and the runtime test then expects cuda';
const FAILING = 'test/attacks/failing-engine.e2e.test.ts';
const TLS_TEST =
  'serves HTTPS to a TLS client that trusts its certificate, takes a renewed one on SIGHUP, keeps it when the new files do not load';
const FAILING_TEST =
  'reaches its client as the failure it was under pdctl serve --retry-limit 0 --no-outlier-ejection, and the engine stays in rotation';

/** How each option of each command is proven: the test below that does, or what is left to do. */
const PROOFS: Record<string, Record<string, Proof>> = {
  serve: {
    '--host': { test: WIDE },
    '--allow-open': { test: EXITS },
    '--tls-cert': { file: 'test/tls.e2e.test.ts', test: TLS_TEST },
    '--tls-key': { file: 'test/tls.e2e.test.ts', test: TLS_TEST },
    '--port': { test: WIDE },
    '--data-dir': { test: WIDE },
    '--journal': { test: WIDE },
    '--standby': { test: EXITS },
    '--lease-ms': {
      file: PG,
      test: 'refuses a second leader, and --standby without a shared journal, with what to do',
    },
    '--bus': { test: WIDE },
    '--durability': { test: ENV },
    '--retain': { test: WIDE },
    '--archive': { test: WIDE },
    '--retain-events': { test: WIDE },
    '--insecure-bus': { test: WIDE },
    '--engine-key': { test: WIDE },
    '--prefill': { test: WIDE },
    '--decode': { test: WIDE },
    '--planner': { test: WIDE },
    '--planner-interval': { test: WIDE },
    '--planner-budget': { test: WIDE },
    '--slo-ttft-ms': { test: WIDE },
    '--slo-itl-ms': { test: WIDE },
    '--model': { test: EXITS },
    '--sequences': { test: WIDE },
    '--context-size': {
      file: LLAMA_SERVE,
      test: 'refuses a request beyond the context with context_length_exceeded, writing nothing',
    },
    '--threads': { file: LLAMA_SERVE, test: RUNTIME },
    '--gpu': { test: WIDE },
    '--pages': { test: WIDE },
    '--page-bytes': { test: WIDE },
    '--kv-bytes-per-token': { test: WIDE },
    '--prefill-us-per-token': { test: WIDE },
    '--prefill-compute': { test: WIDE },
    '--decode-us-per-token': { test: WIDE },
    '--decode-compute': { test: WIDE },
    '--kv-device': { test: EXITS },
    '--kv-block-tokens': { test: WIDE },
    '--prefix-cache-pages': { test: WIDE },
    '--prefix-reuse': { test: WIDE },
    '--kv-transport': { test: WIDE },
    '--max-rooms-per-engine': { test: WIDE },
    '--router': { test: WIDE },
    '--router-overlap-weight': { test: WEIGHED },
    '--canary-interval-ms': { test: WIDE },
    '--canary-deadline-ms': { test: BY_HAND },
    '--no-restart-stalled': {
      file: 'test/health.e2e.test.ts',
      test: 'turns ready and deep red within 5 s of a frozen prefill bus loop, while /health stays green',
    },
    '--no-outlier-ejection': { file: FAILING, test: FAILING_TEST },
    '--allow-fault-injection': { test: WIDE },
    '--migration-limit': {
      file: 'test/engine-restart.e2e.test.ts',
      test: 'a request whose engines die more often than pdctl serve --migration-limit fails cleanly',
    },
    '--retry-limit': { file: FAILING, test: FAILING_TEST },
    '--request-timeout-ms': { test: WIDE },
    '--max-connections': { test: WIDE },
    '--admission-wait-ms': { test: ENV },
    '--queue-max': { test: WIDE },
    '--queue-ttl': { test: WIDE },
    '--drain-timeout-ms': { test: WIDE },
    '--log-level': { test: WIDE },
    '--log-format': { test: WIDE },
  },
  engine: {
    '--role': { test: BY_HAND },
    '--id': { test: BY_HAND },
    '--control': { test: BY_HAND },
    '--model': { test: ENGINE_EXITS },
    '--sequences': {
      file: LLAMA_ROOMS,
      test: 'refuses an engine whose KV states the others could not load (another --sequences)',
    },
    '--context-size': { file: LLAMA_SERVE, test: RUNTIME },
    '--threads': { file: LLAMA_SERVE, test: RUNTIME },
    '--gpu': { todo: GPU_TODO },
    '--pages': { test: BY_HAND },
    '--page-bytes': { test: BY_HAND },
    '--kv-bytes-per-token': { test: BY_HAND },
    '--prefill-us-per-token': { test: BY_HAND },
    '--prefill-compute': { test: BY_HAND },
    '--decode-us-per-token': { test: BY_HAND },
    '--decode-compute': { test: BY_HAND },
    '--kv-device': { test: ENGINE_EXITS },
    '--kv-block-tokens': { test: BY_HAND },
    '--prefix-cache-pages': { test: BY_HAND },
    '--prefix-reuse': {
      file: LLAMA_ROOMS,
      test: 'reuses the prefix a sequence holds: a prompt that continues an earlier one computes only the rest, token for token as a cold run',
    },
    '--kv-transport': { test: BY_HAND },
    '--transfer-threads': { test: BY_HAND },
    '--prefill-concurrency': { test: BY_HAND },
    '--chunk-tokens': { test: BY_HAND },
    '--heartbeat-ms': { test: BY_HAND },
    '--drain-timeout-ms': { test: BY_HAND },
    '--allow-fault-injection': { test: BY_HAND },
    '--insecure-bus': { test: WIDE },
    '--log-level': { test: BY_HAND },
    '--log-format': { test: BY_HAND },
  },
  'journal prune': {
    '--older-than': { test: PRUNE },
    '--events-older-than': { test: PRUNE },
    '--chunk': { test: PRUNE },
    '--dry-run': { test: PRUNE },
    '--archive': { test: PRUNE },
    '--url': { test: PRUNE_URL },
    '--journal': { test: PRUNE },
    '--json': { test: PRUNE },
  },
  drill: {
    '--clients': { test: DRILL },
    '--data-dir': { test: DRILL },
    '--url': {
      file: DRILLS,
      test: '--url: drills a running pdctl serve through its HTTP API, and says what it cannot do there',
    },
    '--model': { test: DRILL_EXITS },
    '--sequences': {
      file: DRILLS,
      test: 'with a llama.cpp model (--model --sequences 2): every engine runs that model, and the drill checks answers whole',
    },
    '--json': { test: DRILL },
    '--report': { test: DRILL },
    '--no-baseline': { test: DRILL },
    '--no-outlier-ejection': { file: DRILLS, test: BAD_ENGINE_OFF },
    '--retry-limit': { file: DRILLS, test: BAD_ENGINE_OFF },
    '--strict-targets': { test: DRILL_TARGETS },
    '--target': { test: DRILL_TARGETS },
    '--journal-events': {
      file: DRILLS,
      test: 'kill-control-plane --journal-events: restarted on a journal filled first, ready, engines not restarted, orphans failed',
    },
    '--postgres': { file: PG, test: 'pdctl drill control-plane-failover: every invariant holds' },
    '--log-level': { test: DRILL },
  },
};

describe('every option has a row', () => {
  for (const [command, proofs] of Object.entries(PROOFS)) {
    it(`pdctl ${command}: each option it parses is proven here or listed as to do, and no row is stale`, () => {
      const flags = optionsOf(command.split(' ')).map((o) => o.flag);
      expect(flags.filter((f) => !(f in proofs))).toEqual([]);
      expect(Object.keys(proofs).filter((f) => !flags.includes(f))).toEqual([]);
    });
    for (const [flag, proof] of Object.entries(proofs))
      if ('todo' in proof) it.todo(`pdctl ${command} ${flag}: ${proof.todo}`);
  }
  it('each test a row names exists below, or in the file it names', () => {
    const rows = Object.values(PROOFS).flatMap((r) => Object.values(r));
    const named = new Set(rows.flatMap((p) => ('test' in p && !('file' in p) ? [p.test] : [])));
    expect([...named].sort()).toEqual(
      [
        ENV,
        EXITS,
        WIDE,
        WEIGHED,
        BY_HAND,
        ENGINE_EXITS,
        PRUNE,
        PRUNE_URL,
        DRILL,
        DRILL_EXITS,
        DRILL_TARGETS,
      ].sort(),
    );
    for (const p of rows)
      if ('file' in p) expect(readFileSync(p.file, 'utf8'), p.file).toContain(`'${p.test}'`);
  });
});

/** A free TCP port on `host`. */
function freePort(host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, host, () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

async function json<T>(url: string): Promise<T> {
  const r = await fetch(url);
  expect(r.status, url).toBe(200);
  return (await r.json()) as T;
}

const completion = (url: string, maxTokens: number) =>
  fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'pdctl-deterministic-1',
      prompt: 'the river',
      max_tokens: maxTokens,
    }),
  });

interface Stats {
  journal: { path: string };
  bus: { endpoint: string };
  health: { synchronous?: string };
}

interface EngineView {
  id: string;
  role: string;
  pid: number;
  totalPages: number;
  pageBytes: number;
  faultInjection: boolean;
}

/** The flags an engine process was started with (its command line, from /proc). */
function engineArgs(pid: number): Map<string, string> {
  const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
  const out = new Map<string, string>();
  argv.forEach((a, i) => {
    if (a.startsWith('--')) out.set(a, argv[i + 1]?.startsWith('--') ? '' : (argv[i + 1] ?? ''));
  });
  return out;
}

/** Opens a TCP connection and says when the server ends it, and with what it answered. */
function socketTo(url: string): { socket: Socket; ended: Promise<string> } {
  const { hostname, port } = new URL(url);
  const socket = connect(Number(port), hostname);
  let got = '';
  socket.on('data', (d) => {
    got += d.toString();
  });
  const ended = new Promise<string>((resolve) => {
    socket.once('close', () => resolve(got));
  });
  socket.on('error', () => {});
  return { socket, ended };
}

describe('pdctl serve, flag by flag', () => {
  it(WIDE, async () => {
    const dir = tempDir('pdctl-flags-');
    const host = '127.0.0.2';
    const port = await freePort(host);
    const journal = join(dir, 'wide.db');
    const archive = join(dir, 'archive');
    const dataDir = join(dir, 'data');
    const star = newKeyPair().publicKey;
    const s = startServe(
      [
        ...['--host', host, '--port', String(port), '--data-dir', dataDir, '--journal', journal],
        ...['--bus', `ipc://${join(dir, 'bus.sock')}`, '--insecure-bus'],
        ...['--engine-key', `*=${star}`],
        ...['--retain', '20m', '--retain-events', '40m', '--archive', archive],
        ...['--prefill', '2', '--decode', '1'],
        ...['--planner', 'act', '--planner-interval', '45s', '--planner-budget', '5'],
        ...['--slo-ttft-ms', '700', '--slo-itl-ms', '70'],
        ...['--pages', '300', '--page-bytes', '8192', '--kv-bytes-per-token', '32'],
        ...['--sequences', '3', '--gpu', 'cpu'],
        ...['--prefill-us-per-token', '3', '--prefill-compute', 'device'],
        ...['--decode-us-per-token', '150000', '--decode-compute', 'device'],
        ...['--kv-block-tokens', '32', '--prefix-cache-pages', '16', '--prefix-reuse', 'off'],
        ...['--kv-transport', 'shm', '--max-rooms-per-engine', '1', '--router', 'round-robin'],
        ...['--canary-interval-ms', '0', '--allow-fault-injection'],
        ...['--request-timeout-ms', '1500', '--max-connections', '6'],
        ...['--queue-max', '1', '--queue-ttl', 'interactive=1s'],
        ...['--drain-timeout-ms', '4321', '--log-level', 'debug', '--log-format', 'pretty'],
      ],
      {},
      false,
    );
    try {
      const url = await s.listening;
      expect(new URL(url).hostname).toBe(host);
      expect(Number(new URL(url).port)).toBe(port);
      // --data-dir holds the bus key; --journal is the journal; --bus is the bus.
      expect(readFileSync(join(dataDir, 'bus.key'), 'utf8').length).toBeGreaterThan(0);
      const stats = await json<Stats>(`${url}/v1/stats`);
      expect(stats.journal.path).toBe(journal);
      expect(stats.bus.endpoint).toBe(`ipc://${join(dir, 'bus.sock')}`);
      // --durability left at its default, power: every commit fsynced (SQLite's FULL).
      expect(stats.health.synchronous).toBe('FULL');
      expect(s.stderr()).toContain('--insecure-bus: bus traffic');
      expect(s.stderr()).toContain(`WARNING --engine-key *=${star.slice(0, 8)}`);
      // Retention as the running pass holds it.
      const retention = await json<{
        policy: { roomsMs: number; eventsMs: number; archiveDir: string };
      }>(`${url}/v1/admin/journal/prune`);
      expect(retention.policy).toMatchObject({
        roomsMs: 20 * 60_000,
        eventsMs: 40 * 60_000,
        archiveDir: archive,
      });
      const planner = await json<{
        mode: string;
        intervalMs: number;
        config: { budget: number; sloTtftMs: number; sloItlMs: number };
      }>(`${url}/v1/planner`);
      expect(planner).toMatchObject({
        mode: 'act',
        intervalMs: 45_000,
        config: { budget: 5, sloTtftMs: 700, sloItlMs: 70 },
      });
      // The engines serve started: how many, their pools as they registered them, their flags.
      const { engines } = await json<{ engines: EngineView[] }>(`${url}/v1/engines`);
      expect(engines.map((e) => e.role).sort()).toEqual(['decode', 'prefill', 'prefill']);
      for (const e of engines) {
        expect(e).toMatchObject({ totalPages: 300, pageBytes: 8192, faultInjection: true });
        const args = engineArgs(e.pid);
        expect(Object.fromEntries(args)).toMatchObject({
          '--sequences': '3',
          '--gpu': 'cpu',
          '--kv-bytes-per-token': '32',
          '--prefill-us-per-token': '3',
          '--prefill-compute': 'device',
          '--decode-us-per-token': '150000',
          '--decode-compute': 'device',
          '--kv-block-tokens': '32',
          '--prefix-cache-pages': '16',
          '--prefix-reuse': 'off',
          '--kv-transport': 'shm',
          // The engines registered with a bus that has no CURVE only because they read this: an
          // engine that tried CURVE's handshake there would never get through.
          '--insecure-bus': '',
        });
      }
      const ready = await json<{ checks: { canary: { detail: string } } }>(`${url}/health/ready`);
      expect(ready.checks.canary.detail).toContain('background canary off');
      // One room in flight on the one decode engine (150 ms a token, 12 tokens: about 1.8 s).
      const first = completion(url, 12);
      await waitFor('a room in flight', async () => {
        const live = await json<{ engines: Array<{ liveRooms: number; role: string }> }>(
          `${url}/v1/engines`,
        );
        return live.engines.some((e) => e.role === 'decode' && e.liveRooms > 0);
      });
      // --queue-max 1: the next waits its turn, and one more finds the queue full (429 at once);
      // --queue-ttl interactive=1s: the one waiting is refused after a second, the room still busy.
      const second = completion(url, 1);
      await waitFor('one request waiting', async () =>
        /pdctl_queue_waiting\{band="interactive"\} 1\b/.test(
          await (await fetch(`${url}/metrics`)).text(),
        ),
      );
      const third = await completion(url, 1);
      expect(third.status).toBe(429);
      expect(((await third.json()) as { error: { code: string } }).error.code).toBe('queue_full');
      const waited = await second;
      expect(waited.status).toBe(429);
      expect(((await waited.json()) as { error: { message: string } }).error.message).toMatch(
        /every decode engine has 1 rooms in flight.*\(waited 1000 ms in the interactive queue, its time-to-live\)$/,
      );
      expect((await first).status).toBe(200);
      // --router round-robin: the prefill engines in turn. (Under `kv`, the default, rooms that
      // hold no prefix block go to the cheapest engine: the same one each time, both being idle.)
      const turns: string[] = [];
      for (let i = 0; i < 4; i++) {
        const r = await completion(url, 1);
        expect(r.status).toBe(200);
        const { id } = (await r.json()) as { id: string };
        const { room } = await json<{ room: { prefillEngine: string } }>(`${url}/v1/rooms/${id}`);
        turns.push(room.prefillEngine);
      }
      expect(turns.filter((e, i) => i > 0 && e === turns[i - 1])).toEqual([]);
      // A client that never finishes its request is cut after --request-timeout-ms (408).
      // (Without it, node's 10 s header limit would cut it later: the race tells them apart.)
      const slow = socketTo(url);
      slow.socket.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\n');
      const cut = await Promise.race([
        slow.ended,
        new Promise<string>((resolve) => setTimeout(() => resolve('still open'), 7000)),
      ]);
      slow.socket.destroy();
      expect(cut).toContain('408');
      // --max-connections 6: past 6 open connections (these, held without a request, and any
      // idle one of this process's own fetches), the next is closed unanswered; 4096 by default.
      const held = Array.from({ length: 6 }, () => socketTo(url));
      await Promise.all(
        held.map((h) => new Promise((resolve) => h.socket.once('connect', resolve))),
      );
      const over = socketTo(url);
      over.socket.write('GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
      expect(await over.ended).toBe('');
      for (const h of held) h.socket.destroy();
      // --log-level debug, --log-format pretty: debug lines, not JSON.
      expect(s.stderr()).toMatch(/DEBUG/);
      expect(s.stderr()).not.toMatch(/^\{"level"/m);
    } finally {
      expect(await s.stop()).toBe(0);
    }
    expect(s.stderr()).toContain('draining (at most 4321 ms)');
  }, 60_000);

  it(ENV, async () => {
    const dir = tempDir('pdctl-flags-env-');
    const host = '127.0.0.3';
    const port = await freePort(host);
    const archive = join(dir, 'archive');
    const s = startServe(
      ['--decode', '0', '--admission-wait-ms', '700', '--durability', 'process'],
      {
        PDCTL_HOST: host,
        PDCTL_PORT: String(port),
        PDCTL_DATA_DIR: join(dir, 'data'),
        PDCTL_JOURNAL: join(dir, 'env.db'),
        PDCTL_BUS: `ipc://${join(dir, 'bus.sock')}`,
        PDCTL_RETAIN: '25m',
        PDCTL_ARCHIVE: archive,
        PDCTL_PLANNER: 'off',
      },
      false,
    );
    try {
      const url = await s.listening;
      expect(url).toBe(`http://${host}:${port}`);
      expect(readFileSync(join(dir, 'data', 'bus.key'), 'utf8').length).toBeGreaterThan(0);
      const stats = await json<Stats>(`${url}/v1/stats`);
      expect(stats.journal.path).toBe(join(dir, 'env.db'));
      // --durability process: SQLite's NORMAL, commits not fsynced one by one.
      expect(stats.health.synchronous).toBe('NORMAL');
      expect(stats.bus.endpoint).toBe(`ipc://${join(dir, 'bus.sock')}`);
      const retention = await json<{ policy: { roomsMs: number; archiveDir: string } }>(
        `${url}/v1/admin/journal/prune`,
      );
      expect(retention.policy).toMatchObject({ roomsMs: 25 * 60_000, archiveDir: archive });
      // The planner is off: it has no route.
      expect((await fetch(`${url}/v1/planner`)).status).toBe(404);
      // No decode engine: a request waits --admission-wait-ms for one, then is refused.
      const r = await completion(url, 1);
      expect(r.status).toBe(503);
      expect(((await r.json()) as { error: { message: string } }).error.message).toContain(
        'waited 700 ms',
      );
    } finally {
      expect(await s.stop()).toBe(0);
    }
  }, 60_000);

  it(WEIGHED, async () => {
    // --router-overlap-weight 0.001: a token already queued on the engine holding the prompt's
    // prefix outweighs computing the whole prompt elsewhere. By default (4) the reverse.
    const s = startServe([
      ...['--prefill', '2', '--canary-interval-ms', '0', '--kv-block-tokens', '16'],
      ...['--prefill-us-per-token', '20000', '--router-overlap-weight', '0.001'],
    ]);
    try {
      const url = await s.listening;
      const text = prompt(77, 40);
      const send = async () => {
        const { status, body } = await complete(url, text, 1);
        expect(status).toBe(200);
        const { id } = body;
        return (await json<{ room: { prefillEngine: string } }>(`${url}/v1/rooms/${id}`)).room;
      };
      // One engine computes the prompt and keeps its blocks; then two rooms of it at once: the
      // first goes to that engine (nothing queued there yet), the second, finding the first's
      // remaining tokens queued there, to the other one.
      const holder = (await send()).prefillEngine;
      const [a, b] = await Promise.all([send(), send()]);
      expect([a?.prefillEngine, b?.prefillEngine].sort()).toEqual(['prefill-0', 'prefill-1']);
      expect([a?.prefillEngine, b?.prefillEngine]).toContain(holder);
    } finally {
      expect(await s.stop()).toBe(0);
    }
  }, 60_000);

  it(EXITS, async () => {
    const dir = tempDir('pdctl-flags-exit-');
    const serve = (args: string[], env: NodeJS.ProcessEnv = {}) =>
      pdctl(['serve', '--port', '0', '--bus', 'tcp://127.0.0.1:0', '--data-dir', dir, ...args], {
        env,
      });
    const standby = await serve(['--standby']);
    expect(standby.code).toBe(2);
    expect(standby.stderr).toContain('--standby needs a journal control planes can share');
    for (const [ttl, says] of [
      ['urgent=1s', 'takes band=duration pairs, as interactive=10s,batch=1m'],
      ['batch=soon', '--queue-ttl batch'],
    ]) {
      const bad = await serve(['--queue-ttl', ttl as string]);
      expect(bad.code).toBe(2);
      expect(bad.stderr).toContain(says);
    }
    const model = await serve(['--model', join(dir, 'no-such.gguf')]);
    expect(model.code).not.toBe(0);
    expect(model.stderr).toContain(join(dir, 'no-such.gguf'));
    // Without a CUDA device here, --kv-device is refused naming it (on a GPU host it would start).
    const device = await serve(['--kv-device', '7']);
    expect(device.code).not.toBe(0);
    expect(device.stderr).toContain('--kv-device 7');
    // Off loopback with no tenant and no admin token: refused before anything is bound. With
    // --allow-open, a tenant or an admin token it goes on — to the model here, which is missing
    // (port 0 is never probed), so nothing binds an address that is not loopback.
    const noModel = ['--host', '0.0.0.0', '--model', join(dir, 'no-such.gguf')];
    const open = await serve(noModel);
    expect(open.code).toBe(2);
    expect(open.stderr).toMatch(
      /--host 0\.0\.0\.0 is reachable from the network, and this stack has no tenant and no admin token.*pass --allow-open/,
    );
    const journal = join(dir, 'tenants.db');
    const ways: Array<[string[], NodeJS.ProcessEnv]> = [
      [['--allow-open'], {}],
      [[], { PDCTL_ADMIN_TOKEN: 'sesame' }],
      [['--journal', journal], {}],
    ];
    for (const [args, env] of ways) {
      if (args.includes('--journal'))
        expect((await pdctl(['tenants', 'add', 'acme', '--journal', journal])).code).toBe(0);
      const r = await serve([...noModel, ...args], env);
      expect(r.code, JSON.stringify(args)).not.toBe(0);
      expect(r.stderr).not.toContain('is reachable from the network');
      expect(r.stderr).toContain(join(dir, 'no-such.gguf'));
    }
  }, 60_000);
});

const roomCount = async (where: string[]) => (await roomIds(where)).length;

describe('pdctl journal prune, flag by flag', () => {
  it(PRUNE, async () => {
    const dir = tempDir('pdctl-flags-prune-');
    const journal = join(dir, 'j.db');
    const untouched = join(dir, 'other.db');
    await oldJournal(journal);
    await oldJournal(untouched);
    const all = await roomCount(['--journal', journal]);
    const prune = async (args: string[]) => {
      const r = await pdctl(['journal', 'prune', '--journal', journal, ...args]);
      expect(r.code, r.stderr).toBe(0);
      return r.stdout;
    };
    type Result = { rooms: number; otherEvents: number; batches: number; dryRun?: boolean };
    // --older-than: only the rooms that ended before it; --chunk: that many to a transaction;
    // --json: the result as JSON.
    const first = JSON.parse(
      await prune(['--older-than', '35m', '--chunk', '7', '--json']),
    ) as Result;
    expect(first.rooms).toBeGreaterThan(0);
    expect(first.rooms).toBeLessThan(all);
    expect(first.batches).toBe(Math.ceil(first.rooms / 7));
    expect(await roomCount(['--journal', journal])).toBe(all - first.rooms);
    // --dry-run counts and deletes nothing; --events-older-than takes events of no room too.
    const counted = JSON.parse(
      await prune(['--older-than', '10m', '--dry-run', '--json']),
    ) as Result;
    expect(counted).toMatchObject({ rooms: all - first.rooms, otherEvents: 0, dryRun: true });
    const withOthers = JSON.parse(
      await prune(['--older-than', '10m', '--events-older-than', '15m', '--dry-run', '--json']),
    ) as Result;
    expect(withOthers.otherEvents).toBeGreaterThan(0);
    expect(await roomCount(['--journal', journal])).toBe(all - first.rooms);
    // --archive: what it deletes, the archive then holds; without --json, a sentence.
    const archive = join(dir, 'archive');
    const said = await prune(['--older-than', '10m', '--archive', archive]);
    expect(said).toMatch(new RegExp(`^deleted ${all - first.rooms} terminal rooms`));
    expect(await roomCount(['--journal', journal])).toBe(0);
    expect(await roomCount(['--archive', archive])).toBe(all - first.rooms);
    // --journal: the other file was never touched.
    expect(await roomCount(['--journal', untouched])).toBe(all);
  }, 60_000);

  it(PRUNE_URL, async () => {
    const journal = join(tempDir('pdctl-flags-prune-url-'), 'j.db');
    await oldJournal(journal);
    const all = await roomCount(['--journal', journal]);
    const s = startServe(['--journal', journal, '--canary-interval-ms', '0']);
    try {
      const url = await s.listening;
      const r = await pdctl(['journal', 'prune', '--url', url, '--older-than', '10m', '--json']);
      expect(r.code, r.stderr).toBe(0);
      expect((JSON.parse(r.stdout) as { rooms: number }).rooms).toBe(all);
      // None of the old rooms is left (room listings leave the canary's out).
      expect(await roomCount(['--url', url])).toBe(0);
    } finally {
      expect(await s.stop()).toBe(0);
    }
  }, 60_000);
});

describe('pdctl engine, flag by flag', () => {
  it(BY_HAND, async () => {
    const keys = { 'hand-p': newKeyPair(), 'hand-d': newKeyPair() };
    const s = startServe([
      ...['--prefill', '0', '--decode', '0', '--canary-interval-ms', '0'],
      // serve's own flag, proven here where its engines are slow: a canary's deadline.
      ...['--canary-deadline-ms', '50'],
      // The model's shape, which every engine and the control plane share.
      ...['--kv-bytes-per-token', '4096', '--kv-block-tokens', '4'],
      ...Object.entries(keys).flatMap(([id, k]) => ['--engine-key', `${id}=${k.publicKey}`]),
    ]);
    const engines: ChildProcess[] = [];
    try {
      const url = await s.listening;
      await waitFor('the key line', () => s.stderr().includes('PDCTL_CURVE_SERVER_KEY='));
      const server = /PDCTL_CURVE_SERVER_KEY='([^']+)'/.exec(s.stderr())?.[1] as string;
      // The bus serve bound (the helper asks for any free port).
      const bus = /· bus (tcp:\/\/\S+)/.exec(s.stderr())?.[1] as string;
      const engine = (id: keyof typeof keys, role: string, args: string[]) => {
        const child = spawnPdctl(
          ['engine', '--role', role, '--id', id, '--control', bus, ...args],
          {
            env: {
              ...process.env,
              PDCTL_CURVE_SERVER_KEY: server,
              PDCTL_CURVE_PUBLIC_KEY: keys[id].publicKey,
              PDCTL_CURVE_SECRET_KEY: keys[id].secretKey,
            },
          },
        );
        let err = '';
        child.stderr?.on('data', (d: Buffer) => {
          err += d.toString();
        });
        child.stdout?.resume();
        engines.push(child);
        return () => err;
      };
      const shape = ['--kv-bytes-per-token', '4096', '--kv-block-tokens', '4'];
      const prefillLog = engine('hand-p', 'prefill', [
        ...['--pages', '200', '--page-bytes', '8192', '--allow-fault-injection'],
        ...['--kv-transport', 'shm', '--prefill-us-per-token', '30000'],
        ...['--heartbeat-ms', '50', '--log-level', 'debug', '--log-format', 'pretty'],
        ...['--prefill-compute', 'device', '--prefix-cache-pages', '4'],
        ...['--transfer-threads', '9', '--prefill-concurrency', '1', ...shape],
      ]);
      const decodeLog = engine('hand-d', 'decode', [
        ...['--pages', '300', '--page-bytes', '8192', '--chunk-tokens', '1'],
        ...['--decode-us-per-token', '40000', '--log-level', 'warn'],
        ...['--decode-compute', 'device', '--drain-timeout-ms', '300', ...shape],
      ]);
      type View = EngineView & { kvSend: string; heartbeats: number; liveRooms: number };
      const view = async () =>
        (await json<{ engines: View[] }>(`${url}/v1/engines`)).engines.sort((a, b) =>
          a.id.localeCompare(b.id),
        );
      await waitFor(
        'both engines registered',
        async () => (await view()).length === 2,
        30_000,
      ).catch((err: Error) => {
        throw new Error(`${err.message}\nprefill:\n${prefillLog()}\ndecode:\n${decodeLog()}`);
      });
      // --role, --id, --control: each registered as what it was told, on that bus.
      const [d, p] = await view();
      expect(p).toMatchObject({ id: 'hand-p', role: 'prefill', totalPages: 200, pageBytes: 8192 });
      expect(p).toMatchObject({ faultInjection: true, kvSend: 'shm' });
      expect(d).toMatchObject({
        id: 'hand-d',
        role: 'decode',
        totalPages: 300,
        faultInjection: false,
      });
      // --heartbeat-ms 50: twenty a second, where the decode engine's default (250) sends four.
      const before = await view();
      await new Promise((r) => setTimeout(r, 2000));
      const after = await view();
      const beats = (i: number) => (after[i]?.heartbeats ?? 0) - (before[i]?.heartbeats ?? 0);
      expect(beats(1)).toBeGreaterThan(2 * beats(0));
      // --prefill-us-per-token, --decode-us-per-token: the room's time in each state;
      // --chunk-tokens 1: one token message a token.
      const tokensBefore = (await json<{ control: { tokens: number } }>(`${url}/v1/stats`)).control
        .tokens;
      const r = await completion(url, 6);
      expect(r.status).toBe(200);
      const answer = (await r.json()) as {
        id: string;
        usage: { prompt_tokens: number; completion_tokens: number };
      };
      const stats = await json<{ control: { tokens: number } }>(`${url}/v1/stats`);
      expect(stats.control.tokens - tokensBefore).toBe(answer.usage.completion_tokens);
      const room = await json<{ spans: Array<{ state: string; ms: number | null }> }>(
        `${url}/v1/rooms/${answer.id}`,
      );
      // A span is the difference of two stamps the control plane gives as it commits: a loaded
      // one may commit a state's start late and read it short (57 ms of 60 seen in CI). Half of
      // the compute asked for still tells the flags from the defaults (no compute time at all).
      const ms = (state: string) => (room.spans.find((x) => x.state === state)?.ms ?? 0) + 1;
      expect(ms('prefilling')).toBeGreaterThanOrEqual((answer.usage.prompt_tokens * 30) / 2);
      expect(ms('decoding')).toBeGreaterThanOrEqual(
        ((answer.usage.completion_tokens - 1) * 40) / 2,
      );
      // serve --canary-deadline-ms 50: a canary through engines that take 30 ms a prompt token
      // and 40 ms a token cannot finish in time (by default it has 2000 ms).
      const deep = await fetch(`${url}/health/deep`);
      expect(deep.status).toBe(503);
      expect(await deep.text()).toContain('within 50 ms');
      // --log-format pretty: the prefill engine's lines are not JSON; --log-level warn: the
      // decode engine says nothing of its start, which the prefill engine (debug) does.
      expect(prefillLog()).toMatch(/INFO {2}engine: engine started/);
      expect(prefillLog()).not.toMatch(/^\{"level"/m);
      expect(decodeLog()).not.toContain('engine started');
      await shapeAndPace(url, p?.pid as number, d?.pid as number);
      // --drain-timeout-ms 300: SIGTERM with a room of 4 s in flight; the engine waits 300 ms
      // for it (30 s by default, long enough for the room to end) and exits holding it.
      const leave = new AbortController();
      const long = fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: 'pdctl-deterministic-1',
          prompt: 'the sea',
          max_tokens: 100,
        }),
        signal: leave.signal,
      }).catch(() => null);
      await waitFor('the long room decoding', async () =>
        (await view()).some((e) => e.id === 'hand-d' && e.liveRooms > 0),
      );
      const decoder = engines[1] as ChildProcess;
      const gone = new Promise((resolve) => decoder.once('exit', resolve));
      decoder.kill('SIGTERM');
      await gone;
      expect(decodeLog()).toContain('drain timed out; exiting with rooms held');
      leave.abort();
      await long;
    } finally {
      for (const e of engines) e.kill('SIGTERM');
      await Promise.all(
        engines.map((e) =>
          e.exitCode !== null ? null : new Promise((resolve) => e.once('exit', resolve)),
        ),
      );
      expect(await s.stop()).toBe(0);
    }
  }, 90_000);

  /** Seconds of CPU the process has used (user and system), from /proc. */
  function cpuSeconds(pid: number): number {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
    return (Number(fields[11]) + Number(fields[12])) / 100;
  }

  /**
   * The hand-started pair's shape and pace, from two rooms of 20-word prompts sent at once:
   * `--kv-bytes-per-token`, `--kv-block-tokens`, `--prefix-cache-pages`, `--prefill-concurrency`,
   * `--prefill-compute`, `--decode-compute`, `--transfer-threads`.
   */
  async function shapeAndPace(url: string, prefillPid: number, decodePid: number): Promise<void> {
    const cpu = { prefill: cpuSeconds(prefillPid), decode: cpuSeconds(decodePid) };
    const rooms = await Promise.all(
      [1, 2].map(async (i) => {
        const { status, body } = await complete(url, prompt(900 + i, 20), 12);
        expect(status).toBe(200);
        const { id, usage } = body;
        type Ev = { type: string; ts: number; data: Record<string, unknown> };
        const { events } = await json<{ events: Ev[] }>(`${url}/v1/rooms/${id}`);
        const at = (type: string) => events.find((e) => e.type === type) as Ev;
        return { prompt: usage.prompt_tokens, at };
      }),
    );
    const [first, second] = rooms.sort(
      (a, b) => a.at('room.prefill_started').ts - b.at('room.prefill_started').ts,
    ) as [(typeof rooms)[0], (typeof rooms)[0]];
    // --prefill-concurrency 1: the second room's prefill began only once the first's KV was
    // computed (8 at once by default: both would have begun together).
    expect(second.at('room.prefill_started').ts).toBeGreaterThanOrEqual(
      first.at('room.transfer_posted').ts,
    );
    for (const room of [first, second]) {
      const posted = room.at('room.transfer_posted').data;
      // --kv-bytes-per-token 4096 on 8192-byte pages: two tokens a page (128 with the default 64).
      expect(posted.pairs).toBe(Math.ceil(room.prompt / 2));
      // --kv-block-tokens 4 (64 by default: no whole block in 20 words) and --prefix-cache-pages
      // 4 (a quarter of the pool by default): two blocks of two pages each are kept.
      expect(posted.storedBlocks).toHaveLength(2);
    }
    // Past those 4 pages the oldest blocks go: the second room's took the first room's place.
    const blocks = (room: typeof first, key: string) =>
      [...(room.at('room.transfer_posted').data[key] as string[])].sort();
    expect(blocks(second, 'evictedBlocks')).toEqual(blocks(first, 'storedBlocks'));
    // --prefill-compute device, --decode-compute device: each engine waited out 2 × 20 × 30 ms of
    // prefill and 2 × 11 × 40 ms of decode steps with its CPU free (spin, the default, burns it).
    expect(cpuSeconds(prefillPid) - cpu.prefill).toBeLessThan(0.3);
    expect(cpuSeconds(decodePid) - cpu.decode).toBeLessThan(0.2);
    // --transfer-threads 9: the prefill engine's process runs nine copy threads (2 by default).
    const copiers = readdirSync(`/proc/${prefillPid}/task`).filter(
      (t) => readFileSync(`/proc/${prefillPid}/task/${t}/comm`, 'utf8').trim() === 'pdctl-transfer',
    );
    expect(copiers).toHaveLength(9);
  }

  it(ENGINE_EXITS, async () => {
    const dir = tempDir('pdctl-flags-engine-exit-');
    const k = newKeyPair();
    const env = {
      PDCTL_CURVE_SERVER_KEY: k.publicKey,
      PDCTL_CURVE_PUBLIC_KEY: k.publicKey,
      PDCTL_CURVE_SECRET_KEY: k.secretKey,
    };
    const engine = (args: string[]) =>
      pdctl(
        ['engine', '--role', 'decode', '--id', 'd', '--control', 'tcp://127.0.0.1:1', ...args],
        { env: { ...process.env, ...env } },
      );
    const model = await engine(['--model', join(dir, 'no-such.gguf')]);
    expect(model.code).not.toBe(0);
    expect(model.stderr).toContain(join(dir, 'no-such.gguf'));
    // Without a CUDA device here, --kv-device is refused naming it (on a GPU host it would start).
    const device = await engine(['--kv-device', '7']);
    expect(device.code).toBe(2);
    expect(device.stderr).toContain('--kv-device 7: ');
  }, 60_000);
});

describe('pdctl drill, flag by flag', () => {
  it(DRILL, async () => {
    const dir = tempDir('pdctl-flags-drill-');
    const report = join(dir, 'report.html');
    const r = await pdctl(
      [
        ...['drill', 'malformed-frames', '--clients', '3', '--no-baseline', '--json'],
        ...['--report', report, '--data-dir', join(dir, 'drills'), '--log-level', 'error'],
      ],
      { timeoutMs: 90_000 },
    );
    expect(r.code, r.stderr).toBe(0);
    const out = JSON.parse(r.stdout) as {
      passed: boolean;
      invariants: Array<{ name: string; ok: boolean; figure: Record<string, unknown> }>;
      journal: string;
      fullRestartMs: number | null;
      samples: Array<{ live: Record<string, number> }>;
    };
    expect(out.passed).toBe(true);
    // What the drill itself proves (it ran here instead of in drill.e2e): the bus loop lived.
    const dropped = out.invariants.find(
      (i) => i.name === 'every hostile frame dropped and counted',
    );
    expect(dropped?.figure.loopRestarts).toBe(0);
    // --data-dir holds its journal; --no-baseline: no full-stack restart timed.
    expect(out.journal.startsWith(join(dir, 'drills'))).toBe(true);
    expect(out.fullRestartMs).toBeNull();
    // --clients 3: 3 rooms in flight, and a fourth at most beside them (a room of the drill's
    // own, or a client's next one created before its last ended); 8 clients by default.
    const live = out.samples.map((x) => Object.values(x.live).reduce((a, b) => a + b, 0));
    expect(Math.max(...live)).toBeGreaterThanOrEqual(3);
    expect(Math.max(...live)).toBeLessThanOrEqual(4);
    expect(readFileSync(report, 'utf8')).toMatch(/^<!doctype html>/i);
    // --log-level error: none of the warnings it logs by default (each hostile frame dropped).
    expect(r.stderr).not.toMatch(/"level":40/);
  }, 120_000);

  it(DRILL_TARGETS, async () => {
    const dir = tempDir('pdctl-flags-drill-targets-');
    type Report = {
      passed: boolean;
      invariants: Array<{ name: string; ok: boolean; figure: Record<string, unknown> }>;
    };
    // `time to all terminal` held to 0 ms, which no drop meets (2000 ms is the drill's own).
    const run = async (more: string[]) => {
      const r = await pdctl(
        [
          ...['drill', 'abort-cascade', '--clients', '2', '--no-baseline', '--json'],
          ...['--data-dir', dir, '--target', 'time to all terminal=0', ...more],
        ],
        { timeoutMs: 90_000 },
      );
      const report = JSON.parse(r.stdout) as Report;
      return { code: r.code, report, missed: report.invariants.filter((i) => !i.ok) };
    };
    // --target: the target is missed, at the figure given; a miss is reported, not counted.
    const lax = await run([]);
    expect(lax.missed.map((i) => [i.name, i.figure.targetMs])).toEqual([
      ['time to all terminal', 0],
    ]);
    expect(lax.code).toBe(0);
    expect(lax.report.passed).toBe(true);
    // --strict-targets: the same miss fails the drill.
    const strict = await run(['--strict-targets']);
    expect(strict.missed.map((i) => i.name)).toEqual(['time to all terminal']);
    expect(strict.code).toBe(1);
    expect(strict.report.passed).toBe(false);
    // A name no drill times is refused, with the names there are.
    const typo = await pdctl(['drill', 'abort-cascade', '--target', 'time to lunch=5']);
    expect(typo.code).toBe(2);
    expect(typo.stderr).toContain('"time to all terminal"');
  }, 120_000);

  it(DRILL_EXITS, async () => {
    const dir = tempDir('pdctl-flags-drill-exit-');
    const r = await pdctl(['drill', 'kill-decode', '--model', join(dir, 'no-such.gguf')]);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toContain(join(dir, 'no-such.gguf'));
  }, 60_000);
});
