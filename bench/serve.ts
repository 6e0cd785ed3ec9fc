/**
 * HTTP serving benchmark: non-streaming completions of 16 tokens at 1, 16 and 64 concurrent
 * connections through `pdctl serve`'s API, against the same load through `submit()` in-process
 * (the baseline, measured in the same run), and time to first token for streaming requests. Model
 * compute near zero, so the figures are the control plane's, the journal's and HTTP's. The HTTP
 * load comes from a client process of its own (serve-client.ts), as it would in production; the
 * server's CPU per request is measured in the server's process. Closed loops at 1, 16 and 64
 * connections saturate two cores from 16 on, where latency is queueing; so the same comparison
 * also runs open-loop at a fixed rate, a quarter and a half of submit()'s 16-connection
 * throughput, where it is what each request costs.
 *
 *   npm run bench:serve                    # a table
 *   npm run bench:serve -- --json          # one JSON object with stable keys
 */
import { fork } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { startServing } from '../src/app/serving.ts';
import type { Durability } from '../src/journal/store.ts';
import { silentLogger } from '../src/log.ts';
import { asJson, atRate, checkFlags, flag, percentile, say } from './args.ts';
import type { ClientJob, ClientResult } from './serve-client.ts';

const SECONDS = Number(flag('--seconds', '3'));
const DURABILITY = flag('--durability', 'power') as Durability;
checkFlags();
const CONNECTIONS = [1, 16, 64];
const MAX_TOKENS = 16;
// A cell with no samples (every request of it failed) is NaN, not a crash: the errors column says why.
const r2 = (x: number | null) => (x == null || Number.isNaN(x) ? Number.NaN : Number(x.toFixed(2)));

interface Cell {
  rps: number;
  /** Request times, sorted ascending. */
  ms: number[];
  errors: number;
  /** This (the server's) process's CPU per request: API and control plane. */
  cpuMsPerRequest: number;
  /** The HTTP client process's CPU per request (0 for submit(), whose caller is in-process). */
  clientCpuMsPerRequest: number;
}

/** A cell of in-process `submit()` calls: this process's CPU since `cpu0` over the answers. */
function inProcessCell(ms: number[], errors: number, t0: number, cpu0: NodeJS.CpuUsage): Cell {
  const cpu = process.cpuUsage(cpu0);
  ms.sort((a, b) => a - b);
  return {
    rps: ms.length / ((performance.now() - t0) / 1000),
    ms,
    errors,
    cpuMsPerRequest: (cpu.user + cpu.system) / 1000 / Math.max(1, ms.length),
    clientCpuMsPerRequest: 0,
  };
}

/** The in-process baseline: `submit()` from `connections` loops, one request at a time each. */
async function loadSubmit(connections: number): Promise<Cell> {
  const cpu0 = process.cpuUsage();
  const ms: number[] = [];
  let errors = 0;
  const end = performance.now() + SECONDS * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: connections }, async (_, c) => {
      for (let i = 0; performance.now() < end; i++) {
        const t = performance.now();
        try {
          await control.submit({ prompt: prompt(c * 100_000 + i), maxTokens: MAX_TOKENS }).result;
          ms.push(performance.now() - t);
        } catch {
          errors++;
        }
      }
    }),
  );
  return inProcessCell(ms, errors, t0, cpu0);
}

/** `submit()` at `rate` requests/s on a fixed schedule; times count from when each was due. */
async function loadSubmitAtRate(rate: number): Promise<Cell> {
  const cpu0 = process.cpuUsage();
  const ms: number[] = [];
  let errors = 0;
  const t0 = performance.now();
  await atRate(rate, SECONDS, async (i, due) => {
    try {
      await control.submit({ prompt: prompt(i), maxTokens: MAX_TOKENS }).result;
      ms.push(performance.now() - due);
    } catch {
      errors++;
    }
  });
  return inProcessCell(ms, errors, t0, cpu0);
}

/** The same load over HTTP, from the client process: `connections` closed loops, or `rate`. */
async function loadHttp(
  connections: number,
  mode: ClientJob['mode'],
  rate?: number,
): Promise<Cell> {
  const cpu0 = process.cpuUsage();
  const job: ClientJob = {
    base,
    model,
    connections,
    seconds: SECONDS,
    maxTokens: MAX_TOKENS,
    mode,
    ...(rate ? { rate } : {}),
  };
  const r = await new Promise<ClientResult>((resolve, reject) => {
    client.once('message', (m) => resolve(m as ClientResult));
    client.once('exit', (code) => reject(new Error(`the load client exited ${code}`)));
    client.send(job);
  });
  client.removeAllListeners('exit');
  const cpu = process.cpuUsage(cpu0);
  if (r.firstError) say(`  ${r.errors} errors, the first: ${r.firstError}`);
  return {
    rps: r.rps,
    ms: r.ms,
    errors: r.errors,
    cpuMsPerRequest: (cpu.user + cpu.system) / 1000 / Math.max(1, r.ms.length),
    clientCpuMsPerRequest: r.cpuMsPerRequest,
  };
}

const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-serve-'));
const serving = await startServing({
  journalPath: join(dir, 'journal.db'),
  durability: DURABILITY,
  log: silentLogger,
  version: 'bench',
  engineLogLevel: 'error',
  engineArgs: ['--pages', '16384', '--prefill-concurrency', '64'],
  // No background canary: the figures are the clients' requests alone.
  canaryIntervalMs: 0,
});
const { control } = serving.stack;
const base = await serving.listen('127.0.0.1', 0);
const model = control.modelInfo.name;
const prompt = (i: number) => `the harbor keeps ${i % 97} lanterns lit across the quiet water`;
const client = fork(new URL('./serve-client.ts', import.meta.url), [], {
  execArgv: ['--import', 'tsx'],
  stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
});

interface Row {
  connections: number;
  httpRps: number;
  submitRps: number;
  rpsRatio: number;
  httpP50Ms: number;
  httpP99Ms: number;
  submitP50Ms: number;
  submitP99Ms: number;
  addedP50Ms: number;
  addedCpuMsPerRequest: number;
  clientCpuMsPerRequest: number;
  ttftP50Ms: number;
  ttftP99Ms: number;
  errors: number;
}
/** Open loop: requests/s offered, and what HTTP adds to a request at that load. */
interface RateRow {
  offeredRps: number;
  /** Of submit()'s closed-loop throughput at 16 connections in this run. */
  load: number;
  httpP50Ms: number;
  httpP99Ms: number;
  submitP50Ms: number;
  submitP99Ms: number;
  addedP50Ms: number;
  addedCpuMsPerRequest: number;
  clientCpuMsPerRequest: number;
  errors: number;
}
const rows: Row[] = [];
const rateRows: RateRow[] = [];
try {
  await loadSubmit(16); // warm up
  await loadHttp(16, 'complete');
  for (const c of CONNECTIONS) {
    say(`${c} connections: submit() in-process, then HTTP, then streaming, ${SECONDS}s each …`);
    const s = await loadSubmit(c);
    const h = await loadHttp(c, 'complete');
    const f = await loadHttp(c, 'stream');
    rows.push({
      connections: c,
      httpRps: Math.round(h.rps),
      submitRps: Math.round(s.rps),
      rpsRatio: r2(h.rps / s.rps),
      httpP50Ms: r2(percentile(h.ms, 50)),
      httpP99Ms: r2(percentile(h.ms, 99)),
      submitP50Ms: r2(percentile(s.ms, 50)),
      submitP99Ms: r2(percentile(s.ms, 99)),
      addedP50Ms: r2(percentile(h.ms, 50) - percentile(s.ms, 50)),
      addedCpuMsPerRequest: r2(h.cpuMsPerRequest - s.cpuMsPerRequest),
      clientCpuMsPerRequest: r2(h.clientCpuMsPerRequest),
      ttftP50Ms: r2(percentile(f.ms, 50)),
      ttftP99Ms: r2(percentile(f.ms, 99)),
      errors: h.errors + s.errors + f.errors,
    });
  }
  const capacity = rows.find((r) => r.connections === 16)?.submitRps ?? 0;
  for (const load of [0.25, 0.5]) {
    const rate = Math.max(1, Math.round(capacity * load));
    say(
      `${rate} req/s offered (${load * 100}% of submit() at 16 connections): submit(), then HTTP …`,
    );
    const s = await loadSubmitAtRate(rate);
    const h = await loadHttp(1, 'complete', rate);
    rateRows.push({
      offeredRps: rate,
      load,
      httpP50Ms: r2(percentile(h.ms, 50)),
      httpP99Ms: r2(percentile(h.ms, 99)),
      submitP50Ms: r2(percentile(s.ms, 50)),
      submitP99Ms: r2(percentile(s.ms, 99)),
      addedP50Ms: r2(percentile(h.ms, 50) - percentile(s.ms, 50)),
      addedCpuMsPerRequest: r2(h.cpuMsPerRequest - s.cpuMsPerRequest),
      clientCpuMsPerRequest: r2(h.clientCpuMsPerRequest),
      errors: h.errors + s.errors,
    });
  }
} finally {
  client.disconnect();
  await serving.close();
  rmSync(dir, { recursive: true, force: true });
}

if (asJson) {
  process.stdout.write(
    `${JSON.stringify({ bench: 'serve', cores: cpus().length, node: process.version, durability: DURABILITY, seconds: SECONDS, maxTokens: MAX_TOKENS, rows, fixedRate: rateRows }, null, 2)}\n`,
  );
} else {
  process.stdout.write(
    [
      `pdctl serve benchmark — ${cpus().length} cores, node ${process.version}, durability ${DURABILITY}, ${SECONDS}s per cell, ${MAX_TOKENS} tokens per completion,`,
      'near-zero model compute, 1 prefill + 1 decode engine; API and control plane in one process, the HTTP client in another. Baseline: submit() in-process.',
      '',
      '| connections | HTTP req/s | submit() req/s | ratio | HTTP p50 ms | HTTP p99 ms | submit() p50 ms | submit() p99 ms | HTTP added p50 ms | HTTP added CPU ms/req | client CPU ms/req | TTFT p50 ms | TTFT p99 ms | errors |',
      '|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
      ...rows.map(
        (r) =>
          `| ${r.connections} | ${r.httpRps} | ${r.submitRps} | ${r.rpsRatio} | ${r.httpP50Ms} | ${r.httpP99Ms} | ${r.submitP50Ms} | ${r.submitP99Ms} | ${r.addedP50Ms} | ${r.addedCpuMsPerRequest} | ${r.clientCpuMsPerRequest} | ${r.ttftP50Ms} | ${r.ttftP99Ms} | ${r.errors} |`,
      ),
      '',
      "HTTP added CPU: the server process's CPU per HTTP request minus per submit() request. Client CPU: the HTTP client process's, on the same cores.",
      '',
      "Open loop: requests sent on a fixed schedule whatever the answers, at a quarter and a half of submit()'s closed-loop throughput at 16",
      'connections in this run; each time counts from when its request was due.',
      '',
      '| offered req/s | load | HTTP p50 ms | HTTP p99 ms | submit() p50 ms | submit() p99 ms | HTTP added p50 ms | HTTP added CPU ms/req | client CPU ms/req | errors |',
      '|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
      ...rateRows.map(
        (r) =>
          `| ${r.offeredRps} | ${r.load} | ${r.httpP50Ms} | ${r.httpP99Ms} | ${r.submitP50Ms} | ${r.submitP99Ms} | ${r.addedP50Ms} | ${r.addedCpuMsPerRequest} | ${r.clientCpuMsPerRequest} | ${r.errors} |`,
      ),
      '',
      'Target: HTTP + journal add under 2 ms p50 per request over in-process submit().',
      '',
    ].join('\n'),
  );
}
