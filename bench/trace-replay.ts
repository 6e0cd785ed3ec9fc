/**
 * bench:trace — replays a request trace (Mooncake's format, src/planner/trace.ts) against a stack of
 * real processes, once per router, and prints what each router made of it: TTFT and inter-token
 * latency, SLO attainment, goodput, the prefix hit rate against the trace's own bound, and the
 * prefill tokens computed. Midway through each replay it kills the control plane (SIGKILL) and
 * starts it again on the same journal; the engines keep running, so their caches survive, and the
 * new control plane routes from the index it rebuilt from the journal. The hit rate in the minute
 * after the restart is reported against the minute before.
 *
 *   npm run bench:trace -- --trace ../shared/traces/conversation_trace.jsonl --requests 600
 *   npm run bench:trace -- --trace FILE --requests 600 --json
 *
 * How the trace is fitted to the machine (flags):
 * - `--length-scale` (0.125): every hash id of a request becomes one block of
 *   512 × scale tokens (64: `--kv-block-tokens`), words unique to that id, so equal ids give equal
 *   text and every id is one whole prefix block in the engines; a request's prompt is its hash
 *   ids' blocks (its input_length rounded up to whole blocks, times the scale); max_tokens is
 *   output_length × scale, at least 1.
 * - `--time-scale` (0.5): a request arrives at its trace timestamp × this (0.5: twice as fast).
 * - `--prefill` 4, `--decode` 2 engines; `--prefill-us-per-token` (200) and
 *   `--decode-us-per-token` (0) the built-in model's compute (200 µs a token of the scaled
 *   prompts: the prefill devices are about half busy at the scaled arrival rate, where a router's
 *   choices show in queueing; at 40 they are a tenth busy and TTFT is the stack's own overhead
 *   on this machine's two cores, the same for every router); `--cache-pages` per prefill engine
 *   (16384: the working set of the first 600 requests of the conversation trace fits), `--pages`.
 * - `--prefill-compute` (device): each prefill engine's compute time is waited on a simulated
 *   device of its own, as on a fleet where every engine has its GPU; `spin` spends it on the CPU
 *   instead, which every engine here shares (model/deterministic.ts).
 * - `--ttft-slo-ms` (1000) and `--tpot-slo-ms` (50): a request meets its SLO when both hold.
 * - `--routers` (kv,least-loaded,round-robin), `--no-restart`.
 * - `--journal postgres`: each replay on a PostgreSQL journal (a new database on the server
 *   `--postgres-url` or PDCTL_TEST_POSTGRES names, else a throwaway cluster) with a standby
 *   control plane, and the kill midway is a failover: the leader is SIGKILLed, the standby takes
 *   over, the engines (given both) and the client follow it. Default `sqlite`: the control plane
 *   is killed and started again on the same file.
 *
 * Baseline: the trace's own bound on prefix reuse (the share of blocks whose prefix appeared
 * earlier in the trace: a perfect router with infinite caches), computed here from the same
 * requests; and round-robin, measured in the same run.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { drillPostgres, openJournalReader } from '../src/app/journal.ts';
import { newKeyPair } from '../src/bus/admission.ts';
import { prefixPerMinute } from '../src/cli/journal/stats.ts';
import { CONTROL_DEFAULTS } from '../src/control/options.ts';
import { ROUTER_POLICIES, type RouterPolicy } from '../src/control/routing/router.ts';
import { DETERMINISTIC_MODEL_NAME } from '../src/model/deterministic.ts';
import { freePort } from '../src/net.ts';
import { hitRateBound, readTrace, TraceError, type TraceRequest } from '../src/planner/trace.ts';
import { asJson, checkFlags, flag, has, percentile, say } from './args.ts';

const TRACE = flag('--trace', '');
const REQUESTS = Number(flag('--requests', 'Infinity'));
const TIME_SCALE = Number(flag('--time-scale', '0.5'));
const LENGTH_SCALE = Number(flag('--length-scale', '0.125'));
const PREFILL = Number(flag('--prefill', '4'));
const DECODE = Number(flag('--decode', '2'));
const PREFILL_US = Number(flag('--prefill-us-per-token', '200'));
const PREFILL_COMPUTE = flag('--prefill-compute', 'device');
const DECODE_US = Number(flag('--decode-us-per-token', '0'));
const CACHE_PAGES = Number(flag('--cache-pages', '16384'));
const PAGES = Number(flag('--pages', String(CACHE_PAGES + 8192)));
const TTFT_SLO_MS = Number(flag('--ttft-slo-ms', '1000'));
const TPOT_SLO_MS = Number(flag('--tpot-slo-ms', '50'));
const RESTART = !has('--no-restart');
const JOURNAL = flag('--journal', 'sqlite');
const PG_URL = flag('--postgres-url', process.env.PDCTL_TEST_POSTGRES ?? '') || undefined;
const OVERLAP_WEIGHT = flag('--overlap-weight', String(CONTROL_DEFAULTS.routerOverlapWeight));
const ROUTERS = flag('--routers', ROUTER_POLICIES.join(',')).split(',') as RouterPolicy[];
checkFlags();
/** Tokens of one trace block (Mooncake's are 512). */
const TRACE_BLOCK = 512;
const BLOCK = Math.round(TRACE_BLOCK * LENGTH_SCALE);

function usage(problem: string): never {
  process.stderr.write(
    `bench:trace: ${problem}\nusage: npm run bench:trace -- --trace FILE [--requests N] [--time-scale X] [--length-scale Y] [--routers kv,least-loaded,round-robin] [--json]\n`,
  );
  process.exit(2);
}
if (!TRACE) usage('--trace FILE is required (../shared/traces/conversation_trace.jsonl)');
for (const [name, v] of [
  ['--time-scale', TIME_SCALE],
  ['--length-scale', LENGTH_SCALE],
  ['--requests', REQUESTS],
] as const)
  if (!(v > 0)) usage(`${name} must be a positive number, got ${flag(name, '')}`);
if (JOURNAL !== 'sqlite' && JOURNAL !== 'postgres')
  usage(`--journal must be sqlite or postgres, got ${JOURNAL}`);
if (PREFILL_COMPUTE !== 'device' && PREFILL_COMPUTE !== 'spin')
  usage(`--prefill-compute must be device or spin, got ${PREFILL_COMPUTE}`);
if (BLOCK < 1) usage(`--length-scale ${LENGTH_SCALE} makes blocks of less than one token`);
for (const r of ROUTERS)
  if (!(ROUTER_POLICIES as readonly string[]).includes(r))
    usage(`unknown router ${r}; one of ${ROUTER_POLICIES.join(', ')}`);

/** The text of one trace block: words unique to its hash id, one token each for the built-in model. */
function blockText(id: number): string {
  const words: string[] = [];
  for (let j = 0; j < BLOCK; j++) words.push(`h${id.toString(36)}w${j.toString(36)}`);
  return words.join(' ');
}

function promptOf(r: TraceRequest): string {
  return r.hashIds.map(blockText).join(' ');
}

function pdctl(args: string[], env: NodeJS.ProcessEnv = {}): ChildProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/bin.ts', ...args], {
    env: { ...process.env, PDCTL_EXIT_WITH_PARENT: String(process.pid), ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let err = '';
  child.stderr?.on('data', (d: Buffer) => {
    err = (err + d.toString()).slice(-4000);
  });
  child.on('exit', (code, signal) => {
    if (code !== 0 && code !== null && signal === null) say(`  ${args[0]} exited ${code}: ${err}`);
  });
  return child;
}

async function waitFor(what: string, ok: () => Promise<boolean>, ms: number): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await ok().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${what} did not happen within ${ms} ms`);
}

interface Sample {
  ttftMs: number | null;
  /** Per-token gaps between chunks after the first. */
  itlMs: number[];
  tpotMs: number | null;
  error: string | null;
}

/**
 * One streamed completion, timed from its scheduled arrival; retried while no control plane
 * answers, on each of `bases` in turn (a leader and its standby).
 */
async function complete(bases: readonly string[], r: TraceRequest, due: number): Promise<Sample> {
  const body = JSON.stringify({
    model: DETERMINISTIC_MODEL_NAME,
    prompt: promptOf(r),
    max_tokens: Math.max(1, Math.round(r.outputLength * LENGTH_SCALE)),
    stream: true,
  });
  let res: Response | null = null;
  const giveUp = performance.now() + 20_000;
  for (let attempt = 0; !res; attempt++) {
    const base = bases[attempt % bases.length] as string;
    try {
      res = await fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
      });
    } catch (err) {
      if (performance.now() > giveUp) return fail(`unreachable: ${(err as Error).message}`);
      await new Promise((r) => setTimeout(r, 100 / bases.length));
    }
  }
  if (res.status !== 200) return fail(`HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`);
  const reader = (res.body as ReadableStream<Uint8Array>).getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let first: number | null = null;
  let last = 0;
  let tokens = 0;
  let firstTokens = 0;
  const itl: number[] = [];
  for (;;) {
    let chunk: Awaited<ReturnType<typeof reader.read>>;
    try {
      chunk = await reader.read();
    } catch (err) {
      // The control plane was killed under this stream (the restart midway).
      return fail(`stream broken: ${(err as Error).message}`);
    }
    const { value, done } = chunk;
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let i = buf.indexOf('\n\n');
    while (i >= 0) {
      const frame = buf.slice(0, i);
      buf = buf.slice(i + 2);
      i = buf.indexOf('\n\n');
      const data = frame.startsWith('data: ') ? frame.slice(6) : '';
      if (data === '' || data === '[DONE]') continue;
      const msg = JSON.parse(data) as { choices?: Array<{ text?: string }>; error?: unknown };
      if (msg.error) return fail(`stream error: ${JSON.stringify(msg.error).slice(0, 200)}`);
      const text = msg.choices?.[0]?.text ?? '';
      const n = text.split(' ').filter((w) => w !== '').length;
      if (n === 0) continue;
      const now = performance.now();
      if (first === null) {
        first = now;
        firstTokens = n;
      } else itl.push((now - last) / n);
      last = now;
      tokens += n;
    }
  }
  if (first === null) return fail('no tokens');
  return {
    ttftMs: first - due,
    itlMs: itl,
    tpotMs: tokens > firstTokens ? (last - first) / (tokens - firstTokens) : null,
    error: null,
  };
}

function fail(error: string): Sample {
  return { ttftMs: null, itlMs: [], tpotMs: null, error };
}

interface RouterResult {
  router: RouterPolicy;
  hitRate: number;
  /** Share of blocks the router expected its prefill engines to hold when it chose them. */
  expectedRate: number;
  prefillTokens: number;
  ttftMsP50: number;
  ttftMsP99: number;
  itlMsP50: number;
  itlMsP99: number;
  sloAttainment: number;
  goodput: number;
  errors: number;
  /** What went wrong with the requests that failed, and how many of each (messages cut at 80). */
  errorKinds: Record<string, number>;
  /** Hit rate in the minute before the control plane was killed, and the minute after it was back. */
  restart: { hitRateBefore: number; hitRateAfter: number; downMs: number } | null;
}

async function replay(router: RouterPolicy, trace: readonly TraceRequest[]): Promise<RouterResult> {
  const server = newKeyPair();
  const engineKey = newKeyPair();
  // Control planes: the one started first, and with --journal postgres its standby, each with its
  // own data directory (holding the same bus key) and ports.
  const pg =
    JOURNAL === 'postgres'
      ? await drillPostgres(PG_URL, `pdctl_trace_${router.replace('-', '_')}_${process.pid}`)
      : null;
  const planes = await Promise.all(
    (pg ? ['leader', 'standby'] : ['only']).map(async (role) => {
      const dir = mkdtempSync(join(tmpdir(), 'pdctl-trace-'));
      writeFileSync(join(dir, 'bus.key'), JSON.stringify(server), { mode: 0o600 });
      const [http, bus] = [await freePort(), await freePort()];
      const args = [
        'serve',
        ...['--port', String(http), '--bus', `tcp://127.0.0.1:${bus}`],
        ...['--prefill', '0', '--decode', '0', '--data-dir', dir, '--durability', 'process'],
        ...['--router', router, '--kv-block-tokens', String(BLOCK), '--canary-interval-ms', '0'],
        ...['--router-overlap-weight', OVERLAP_WEIGHT],
        ...['--log-level', 'warn', '--engine-key', `*=${engineKey.publicKey}`],
        ...(pg ? ['--journal', pg.url, '--lease-ms', '1000'] : []),
        ...(role === 'standby' ? ['--standby'] : []),
      ];
      return { dir, args, base: `http://127.0.0.1:${http}`, bus: `tcp://127.0.0.1:${bus}` };
    }),
  );
  const [first] = planes as [(typeof planes)[number]];
  const bases = planes.map((p) => p.base);
  let leader = first;
  let serve = pdctl(first.args);
  // Started once the first leads: a standby that finds no leader takes the lead itself.
  let standby: ChildProcess | null = null;
  const engines: ChildProcess[] = [];
  const engine = (role: 'prefill' | 'decode', id: string) =>
    pdctl(
      [
        'engine',
        ...['--role', role, '--id', id, '--control', planes.map((p) => p.bus).join(',')],
        ...['--pages', String(PAGES), '--kv-block-tokens', String(BLOCK)],
        ...['--prefix-cache-pages', String(CACHE_PAGES)],
        ...['--prefill-us-per-token', String(PREFILL_US), '--prefill-compute', PREFILL_COMPUTE],
        ...['--decode-us-per-token', String(DECODE_US), '--log-level', 'warn'],
      ],
      {
        PDCTL_CURVE_SERVER_KEY: server.publicKey,
        PDCTL_CURVE_PUBLIC_KEY: engineKey.publicKey,
        PDCTL_CURVE_SECRET_KEY: engineKey.secretKey,
      },
    );
  const allLive = async () => {
    const base = leader.base;
    const res = await fetch(`${base}/v1/engines`);
    const body = (await res.json()) as { engines: Array<{ status: string }> };
    return (
      body.engines.filter((e) => e.status === 'live').length === PREFILL + DECODE &&
      (await fetch(`${base}/health/ready`)).status === 200
    );
  };
  try {
    await waitFor('pdctl serve', async () => (await fetch(`${first.base}/health`)).ok, 60_000);
    if (planes[1]) standby = pdctl(planes[1].args);
    for (let i = 0; i < PREFILL; i++) engines.push(engine('prefill', `prefill-${i}`));
    for (let i = 0; i < DECODE; i++) engines.push(engine('decode', `decode-${i}`));
    await waitFor('every engine live', allLive, 60_000);
    say(`  ${router}: ${PREFILL} prefill and ${DECODE} decode engines live; replaying`);

    const span = (trace.at(-1)?.timestamp ?? 0) * TIME_SCALE;
    const t0 = performance.now();
    const wall0 = Date.now();
    let restart: { at: number; back: number } | null = null;
    const restarting = RESTART
      ? (async () => {
          await new Promise((r) => setTimeout(r, span / 2));
          const at = Date.now();
          serve.kill('SIGKILL');
          await new Promise((r) => serve.once('exit', r));
          // SQLite: the same control plane again on its file; PostgreSQL: the standby takes over.
          const failover = standby !== null && planes[1] !== undefined;
          if (standby && planes[1]) [serve, leader, standby] = [standby, planes[1], null];
          else serve = pdctl(first.args);
          await waitFor('the control plane back with every engine', allLive, 60_000);
          restart = { at, back: Date.now() };
          say(
            `  ${router}: control plane killed; ${failover ? 'the standby led' : 'it was back'} with every engine in ${restart.back - at} ms`,
          );
        })()
      : Promise.resolve();
    let done = 0;
    const samples = await Promise.all(
      trace.map(async (r) => {
        const due = t0 + r.timestamp * TIME_SCALE;
        const wait = due - performance.now();
        if (wait > 1) await new Promise((res) => setTimeout(res, wait));
        const s = await complete(bases, r, due);
        if (++done % 100 === 0) say(`  ${router}: ${done}/${trace.length} requests answered`);
        return s;
      }),
    );
    await restarting;
    const wallSeconds = (performance.now() - t0) / 1000;
    const all = [...engines, serve, ...(standby ? [standby] : [])];
    for (const c of all) c.kill('SIGTERM');
    await Promise.all(
      all.map((c) => (c.exitCode !== null ? null : new Promise((r) => c.once('exit', r)))),
    );

    const journal = openJournalReader(pg ? pg.url : join(first.dir, 'journal.db'));
    try {
      const minutes = await prefixPerMinute(journal, { since: wall0, until: Date.now() + 1 });
      const sum = (ms: typeof minutes, k: 'blocks' | 'reused' | 'expected') =>
        ms.reduce((n, m) => n + m[k], 0);
      const rate = (ms: typeof minutes) => sum(ms, 'reused') / Math.max(1, sum(ms, 'blocks'));
      let restartFigures: RouterResult['restart'] = null;
      if (restart) {
        const { at, back } = restart as { at: number; back: number };
        const window = Math.min(60_000, at - wall0);
        const before = await prefixPerMinute(journal, { since: at - window, until: at });
        const after = await prefixPerMinute(journal, { since: back, until: back + window });
        restartFigures = {
          hitRateBefore: rate(before),
          hitRateAfter: rate(after),
          downMs: back - at,
        };
      }
      const promptTokens = trace.reduce((n, r) => n + r.hashIds.length * BLOCK, 0);
      const ttft = samples
        .flatMap((s) => (s.ttftMs === null ? [] : [s.ttftMs]))
        .sort((a, b) => a - b);
      const itl = samples.flatMap((s) => s.itlMs).sort((a, b) => a - b);
      const met = samples.filter(
        (s) =>
          s.error === null &&
          (s.ttftMs ?? Infinity) <= TTFT_SLO_MS &&
          (s.tpotMs === null || s.tpotMs <= TPOT_SLO_MS),
      ).length;
      return {
        router,
        hitRate: rate(minutes),
        expectedRate: sum(minutes, 'expected') / Math.max(1, sum(minutes, 'blocks')),
        prefillTokens: promptTokens - sum(minutes, 'reused') * BLOCK,
        ttftMsP50: percentile(ttft, 50),
        ttftMsP99: percentile(ttft, 99),
        itlMsP50: percentile(itl, 50),
        itlMsP99: percentile(itl, 99),
        sloAttainment: met / trace.length,
        goodput: met / wallSeconds,
        errors: samples.filter((s) => s.error !== null).length,
        errorKinds: samples.reduce<Record<string, number>>((kinds, s) => {
          if (s.error !== null)
            kinds[s.error.slice(0, 80)] = (kinds[s.error.slice(0, 80)] ?? 0) + 1;
          return kinds;
        }, {}),
        restart: restartFigures,
      };
    } finally {
      journal.close();
    }
  } finally {
    for (const c of [...engines, serve, ...(standby ? [standby] : [])])
      if (c.exitCode === null) c.kill('SIGKILL');
    for (const p of planes) rmSync(p.dir, { recursive: true, force: true });
    pg?.dispose();
  }
}

const trace = await readTrace(TRACE, REQUESTS).catch((err: Error) => {
  if (err instanceof TraceError || (err as NodeJS.ErrnoException).code === 'ENOENT')
    usage(err.message);
  throw err;
});
const bound = hitRateBound(trace);
const tokens = trace.reduce((n, r) => n + r.hashIds.length * BLOCK, 0);
say(
  `bench:trace: ${trace.length} requests of ${TRACE}, ${bound.blocks} blocks of ${BLOCK} tokens (${tokens} prompt tokens), hit-rate bound ${(100 * bound.bound).toFixed(1)} %; replayed in ${(((trace.at(-1)?.timestamp ?? 0) * TIME_SCALE) / 1000).toFixed(0)} s per router`,
);
const routers: RouterResult[] = [];
for (const router of ROUTERS) routers.push(await replay(router, trace));

if (asJson) {
  process.stdout.write(
    `${JSON.stringify({ hitRateBound: bound.bound, tokens, requests: trace.length, blockTokens: BLOCK, prefillUsPerToken: PREFILL_US, prefillCompute: PREFILL_COMPUTE, journal: JOURNAL, routers }, null, 2)}\n`,
  );
} else {
  const rr = routers.find((r) => r.router === 'round-robin');
  const idealTokens = tokens - bound.seenBefore * BLOCK;
  const pct = (x: number) => `${(100 * x).toFixed(1)} %`;
  const ms = (x: number) => (Number.isNaN(x) ? '-' : x.toFixed(1));
  const rows = routers.map((r) => [
    r.router,
    pct(r.hitRate),
    pct(r.expectedRate),
    (r.hitRate / Math.max(1e-9, bound.bound)).toFixed(2),
    String(r.prefillTokens),
    rr
      ? pct((rr.prefillTokens - r.prefillTokens) / Math.max(1, rr.prefillTokens - idealTokens))
      : '-',
    ms(r.ttftMsP50),
    ms(r.ttftMsP99),
    ms(r.itlMsP50),
    ms(r.itlMsP99),
    pct(r.sloAttainment),
    r.goodput.toFixed(2),
    String(r.errors),
    r.restart ? `${pct(r.restart.hitRateBefore)} → ${pct(r.restart.hitRateAfter)}` : '-',
  ]);
  const header = [
    'router',
    'hit rate',
    'expected',
    '/bound',
    'prefill tokens',
    'gap closed',
    'TTFT p50 ms',
    'TTFT p99 ms',
    'ITL p50 ms',
    'ITL p99 ms',
    'SLO met',
    'goodput req/s',
    'errors',
    'hit rate before → after restart',
  ];
  const widths = header.map((h, i) =>
    Math.max(h.length, ...rows.map((r) => (r[i] as string).length)),
  );
  const line = (cells: string[]) =>
    `| ${cells.map((c, i) => c.padEnd(widths[i] as number)).join(' | ')} |`;
  process.stdout.write(
    [
      `${trace.length} requests, ${tokens} prompt tokens in blocks of ${BLOCK}; prefill ${PREFILL_US} µs a token (${PREFILL_COMPUTE === 'device' ? 'a simulated device per engine' : 'spun on the CPU'}); the trace's hit-rate bound ${pct(bound.bound)} (${idealTokens} prefill tokens with infinite caches and a perfect router); SLO: TTFT ≤ ${TTFT_SLO_MS} ms and TPOT ≤ ${TPOT_SLO_MS} ms; ${JOURNAL === 'postgres' ? 'PostgreSQL journal, the leader killed midway and its standby taking over' : 'SQLite journal, the control plane killed midway and started again'}`,
      line(header),
      line(widths.map((w) => '-'.repeat(w))),
      ...rows.map(line),
      ...routers
        .filter((r) => r.errors > 0)
        .map(
          (r) =>
            `${r.router}: ${Object.entries(r.errorKinds)
              .map(([e, n]) => `${n} × ${e}`)
              .join('; ')}`,
        ),
      '',
    ].join('\n'),
  );
}
