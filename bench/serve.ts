/**
 * HTTP serving benchmark: non-streaming completions of 16 tokens at 1, 16 and 64 concurrent
 * connections through `pdctl serve`'s API, against the same load through `submit()` in-process
 * (the baseline, measured in the same run), and time to first token for streaming requests. Model
 * compute near zero, so the figures are the control plane's, the journal's and HTTP's.
 *
 *   npm run bench:serve                    # a table
 *   npm run bench:serve -- --json          # one JSON object with stable keys
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildApi } from '../src/api/app.ts';
import { ApiMetrics } from '../src/api/metrics.ts';
import { Canary } from '../src/control/canary.ts';
import { startStack } from '../src/control/stack.ts';
import type { Durability } from '../src/journal/sqlite/open.ts';
import { silentLogger } from '../src/log.ts';
import { asJson, flag, percentile, say } from './args.ts';

const SECONDS = Number(flag('--seconds', '3'));
const DURABILITY = flag('--durability', 'power') as Durability;
const CONNECTIONS = [1, 16, 64];
const MAX_TOKENS = 16;
const r2 = (x: number) => Number(x.toFixed(2));

async function load(
  connections: number,
  one: (i: number) => Promise<number>,
): Promise<{
  rps: number /** Request times, sorted ascending. */;
  ms: number[];
  errors: number;
  cpuMsPerRequest: number;
}> {
  const cpu0 = process.cpuUsage();
  const ms: number[] = [];
  let errors = 0;
  const end = performance.now() + SECONDS * 1000;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: connections }, async (_, c) => {
      for (let i = 0; performance.now() < end; i++) {
        try {
          ms.push(await one(c * 100_000 + i));
        } catch {
          errors++;
        }
      }
    }),
  );
  const cpu = process.cpuUsage(cpu0);
  ms.sort((a, b) => a - b);
  return {
    rps: ms.length / ((performance.now() - t0) / 1000),
    ms,
    errors,
    // This process's CPU (API, control plane, and for HTTP the client too) per request.
    cpuMsPerRequest: (cpu.user + cpu.system) / 1000 / Math.max(1, ms.length),
  };
}

const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-serve-'));
const stack = await startStack({
  journalPath: join(dir, 'journal.db'),
  durability: DURABILITY,
  log: silentLogger,
  version: 'bench',
  engineLogLevel: 'error',
  engineArgs: ['--pages', '16384', '--prefill-concurrency', '64'],
});
const { control } = stack;
const metrics = new ApiMetrics(control);
const app = await buildApi({
  control,
  canary: new Canary(control, silentLogger),
  metrics,
  log: silentLogger,
  version: 'bench',
  adminToken: null,
});
const base = await app.listen({ host: '127.0.0.1', port: 0 });
const model = control.modelName;
const prompt = (i: number) => `the harbor keeps ${i % 97} lanterns lit across the quiet water`;

const viaHttp = async (i: number) => {
  const t = performance.now();
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt: prompt(i), max_tokens: MAX_TOKENS }),
  });
  if (r.status !== 200) throw new Error(`HTTP ${r.status}`);
  await r.json();
  return performance.now() - t;
};
const viaSubmit = async (i: number) => {
  const t = performance.now();
  await control.submit({ prompt: prompt(i), maxTokens: MAX_TOKENS }).result;
  return performance.now() - t;
};
const ttft = async (i: number) => {
  const t = performance.now();
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model, prompt: prompt(i), max_tokens: MAX_TOKENS, stream: true }),
  });
  const reader = (r.body as ReadableStream<Uint8Array>).getReader();
  let first = Number.NaN;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    if (Number.isNaN(first) && new TextDecoder().decode(value).includes('"text":" '))
      first = performance.now() - t;
  }
  return first;
};

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
  ttftP50Ms: number;
  ttftP99Ms: number;
  errors: number;
}
const rows: Row[] = [];
try {
  await load(16, viaSubmit); // warm up
  await load(16, viaHttp);
  for (const c of CONNECTIONS) {
    say(`${c} connections: submit() in-process, then HTTP, then streaming, ${SECONDS}s each …`);
    const s = await load(c, viaSubmit);
    const h = await load(c, viaHttp);
    const f = await load(c, ttft);
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
      ttftP50Ms: r2(percentile(f.ms, 50)),
      ttftP99Ms: r2(percentile(f.ms, 99)),
      errors: h.errors + s.errors + f.errors,
    });
  }
} finally {
  await app.close();
  metrics.close();
  await stack.stop();
  rmSync(dir, { recursive: true, force: true });
}

if (asJson) {
  process.stdout.write(
    `${JSON.stringify({ bench: 'serve', cores: cpus().length, node: process.version, durability: DURABILITY, seconds: SECONDS, maxTokens: MAX_TOKENS, rows }, null, 2)}\n`,
  );
} else {
  process.stdout.write(
    [
      `pdctl serve benchmark — ${cpus().length} cores, node ${process.version}, durability ${DURABILITY}, ${SECONDS}s per cell, ${MAX_TOKENS} tokens per completion,`,
      'near-zero model compute, 1 prefill + 1 decode engine; client, API and control plane in this process. Baseline: submit() in-process.',
      '',
      '| connections | HTTP req/s | submit() req/s | ratio | HTTP p50 ms | HTTP p99 ms | submit() p50 ms | submit() p99 ms | HTTP added p50 ms | HTTP added CPU ms/req | TTFT p50 ms | TTFT p99 ms | errors |',
      '|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
      ...rows.map(
        (r) =>
          `| ${r.connections} | ${r.httpRps} | ${r.submitRps} | ${r.rpsRatio} | ${r.httpP50Ms} | ${r.httpP99Ms} | ${r.submitP50Ms} | ${r.submitP99Ms} | ${r.addedP50Ms} | ${r.addedCpuMsPerRequest} | ${r.ttftP50Ms} | ${r.ttftP99Ms} | ${r.errors} |`,
      ),
      '',
      'HTTP added CPU: CPU of this process per HTTP request minus per submit() request (includes the HTTP client).',
      'Target: HTTP + journal add under 2 ms p50 per request over in-process submit().',
      '',
    ].join('\n'),
  );
}
