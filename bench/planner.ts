/**
 * bench:planner — the planner acting (`--planner act`) against every static split of the same
 * engine budget, on a workload that changes: a prefill-heavy phase (long prompts, short answers),
 * then a decode-heavy one (short prompts, long answers), then the shared conversation trace
 * (../shared/traces/, its arrivals and lengths scaled). Engines compute on simulated accelerators
 * (`--prefill-compute device --decode-compute device`): the time is the model's, the CPU stays
 * free, so the split decides the goodput and these 2 cores do not. Goodput: requests a second
 * whose time to first token and inter-token latency (both measured by this client on the stream)
 * meet their targets; a request still unanswered `--grace-seconds` after its phase is cut and
 * misses them. Each configuration serves the same schedule, one after the other, in one run.
 *
 *   npm run build:ts && npm run bench:planner                      # 120 s phases: ~27 minutes
 *   npm run bench:planner -- --phase-seconds 30 --only planner --keep
 */
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { Agent, request } from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { readTrace, type TraceRequest } from '../src/planner/trace.ts';
import { asJson, checkFlags, flag, has, say } from './args.ts';
import { startServe, stop } from './serve-process.ts';

const PHASE_S = Number(flag('--phase-seconds', '120'));
/**
 * Seconds after a phase's last arrival that its requests still have to finish; then the rest are
 * cut (their connections closed: the rooms are aborted) and count as missing the targets. An
 * overloaded split would otherwise stretch its phase by its whole backlog, and start the next one
 * behind.
 */
const GRACE_S = Number(flag('--grace-seconds', '10'));
const BUDGET = Number(flag('--budget', '4'));
const INTERVAL = flag('--planner-interval', '2s');
const SLO_TTFT_MS = Number(flag('--slo-ttft-ms', '1500'));
const SLO_ITL_MS = Number(flag('--slo-itl-ms', '60'));
const PREFILL_US = Number(flag('--prefill-us-per-token', '400'));
const DECODE_US = Number(flag('--decode-us-per-token', '5000'));
/** Run only the configurations whose name contains this (`planner`, `static 2/2`). */
const ONLY = flag('--only', '');
/** Keep each configuration's data dir (its journal) and print where. */
const KEEP = has('--keep');
const TRACE = flag(
  '--trace',
  resolve(import.meta.dirname, '../../shared/traces/conversation_trace.jsonl'),
);
checkFlags();

interface Shape {
  /** Requests a second, on a fixed schedule. */
  rate: number;
  promptWords: number;
  maxTokens: number;
}

interface Phase {
  name: string;
  /** Request i's shape and when it is due, ms from the phase's start. */
  requests: Array<Shape & { at: number }>;
}

const steady = (name: string, s: Shape): Phase => ({
  name,
  requests: Array.from({ length: Math.round(s.rate * PHASE_S) }, (_, i) => ({
    ...s,
    at: (i * 1000) / s.rate,
  })),
});

/** The trace's first requests, their arrivals squeezed into the phase, lengths scaled down. */
function tracePhase(trace: TraceRequest[]): Phase {
  const span = PHASE_S * 1000;
  const used = trace.filter((r) => r.timestamp < span * 2);
  const last = used.at(-1)?.timestamp ?? 1;
  return {
    name: 'conversation trace',
    requests: used.map((r) => ({
      rate: 0,
      at: (r.timestamp / Math.max(last, 1)) * span,
      promptWords: Math.max(10, Math.round(r.inputLength / 16)),
      maxTokens: Math.max(2, Math.min(64, Math.round(r.outputLength / 16))),
    })),
  };
}

interface Outcome {
  ok: boolean;
  /** Still unanswered when the phase's grace ran out, and cut. */
  cut: boolean;
  ttftMs: number;
  itlMs: number;
}

const line = (i: number) => `the harbor keeps ${i % 97} lanterns lit across the quiet water`;
/**
 * Request `i`'s prompt: about `words` words, led by its own number, so that no two share a prefix
 * block — a prefix cache would otherwise turn the prefill-heavy phase into hits after a few
 * seconds, and the phase would not be the load it says.
 */
const promptOf = (i: number, words: number) =>
  `request ${i}: ${Array.from({ length: Math.max(1, Math.round(words / 10)) }, (_, k) => line(i * 7 + k)).join(' ')}`;

/** One streamed completion: time to its first text, and the gaps after it; cut at `cutAt`. */
function streamed(
  base: string,
  agent: Agent,
  i: number,
  s: Shape,
  cutAt: number,
): Promise<Outcome> {
  const body = JSON.stringify({
    model: 'pdctl-deterministic-1',
    prompt: promptOf(i, s.promptWords),
    max_tokens: s.maxTokens,
    stream: true,
  });
  const t0 = performance.now();
  return new Promise((done) => {
    const req = request(
      new URL('/v1/completions', base),
      { method: 'POST', agent, headers: { 'content-type': 'application/json' } },
      (res) => {
        let first = 0;
        let finished = false;
        let buf = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          buf += chunk;
          if (!first && /"text":"[^"]/.test(buf)) first = performance.now();
          if (buf.includes('"finish_reason":"length"') || buf.includes('"finish_reason":"stop"'))
            finished = true;
        });
        res.on('end', () => {
          clearTimeout(cut);
          const end = performance.now();
          const ok = res.statusCode === 200 && finished && first > 0;
          done({
            ok,
            cut: false,
            ttftMs: first ? first - t0 : Number.NaN,
            itlMs: first ? (end - first) / Math.max(1, s.maxTokens - 1) : Number.NaN,
          });
        });
        res.on('error', () => undefined);
      },
    );
    const cut = setTimeout(
      () => {
        done({ ok: false, cut: true, ttftMs: Number.NaN, itlMs: Number.NaN });
        req.destroy();
      },
      Math.max(0, cutAt - t0),
    );
    req.on('error', () => {
      clearTimeout(cut);
      done({ ok: false, cut: false, ttftMs: Number.NaN, itlMs: Number.NaN });
    });
    req.end(body);
  });
}

/** Serves `phase`; its requests are numbered from `first` (each one's prompt is its own). */
async function runPhase(base: string, phase: Phase, first: number): Promise<Outcome[]> {
  const agent = new Agent({ keepAlive: true, maxSockets: 512 });
  const t0 = performance.now();
  const cutAt = t0 + (PHASE_S + GRACE_S) * 1000;
  const out: Array<Promise<Outcome>> = [];
  for (const [i, r] of phase.requests.entries()) {
    const wait = t0 + r.at - performance.now();
    if (wait > 1) await new Promise((w) => setTimeout(w, wait));
    out.push(streamed(base, agent, first + i, r, cutAt));
  }
  const all = await Promise.all(out);
  agent.destroy();
  return all;
}

interface Config {
  name: string;
  args: string[];
}

const ENGINE_ARGS = [
  '--prefill-us-per-token',
  String(PREFILL_US),
  '--prefill-compute',
  'device',
  '--decode-us-per-token',
  String(DECODE_US),
  '--decode-compute',
  'device',
  '--canary-interval-ms',
  '0',
];

const configs: Config[] = [
  ...Array.from({ length: BUDGET - 1 }, (_, k) => ({
    name: `static ${k + 1}/${BUDGET - k - 1}`,
    args: ['--prefill', String(k + 1), '--decode', String(BUDGET - k - 1), '--planner', 'off'],
  })),
  {
    name: 'planner act',
    args: [
      '--prefill',
      String(Math.ceil(BUDGET / 2)),
      '--decode',
      String(Math.floor(BUDGET / 2)),
      '--planner',
      'act',
      '--planner-interval',
      INTERVAL,
      '--planner-budget',
      String(BUDGET),
      '--slo-ttft-ms',
      String(SLO_TTFT_MS),
      '--slo-itl-ms',
      String(SLO_ITL_MS),
    ],
  },
];

const goodput = (o: Outcome[]) =>
  o.filter((x) => x.ok && x.ttftMs <= SLO_TTFT_MS && x.itlMs <= SLO_ITL_MS).length / PHASE_S;

/** The steps the serving planner carried out, oldest first, as its journal holds them. */
function actedSteps(base: string): string[] {
  const r = spawnSync(
    process.execPath,
    [
      resolve(import.meta.dirname, '../bin/pdctl.js'),
      'journal',
      'tail',
      '--url',
      base,
      '--type',
      'planner.decision',
      '-n',
      '10000',
      '--json',
    ],
    { encoding: 'utf8' },
  );
  if (r.status !== 0) throw new Error(`pdctl journal tail failed: ${r.stderr}`);
  return r.stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { data: { acted: boolean; reason: string } })
    .filter((e) => e.data.acted)
    .map((e) => e.data.reason);
}

async function main(): Promise<void> {
  const trace = await readTrace(TRACE).catch(() => null);
  const phases: Phase[] = [
    steady('prefill-heavy', { rate: 8, promptWords: 800, maxTokens: 4 }),
    steady('decode-heavy', { rate: 8, promptWords: 20, maxTokens: 64 }),
    ...(trace ? [tracePhase(trace)] : []),
  ];
  if (!trace) say(`bench:planner: no trace at ${TRACE}; two phases only`);
  const rows: Array<{
    config: string;
    goodput: number[];
    failed: number;
    cut: number;
    steps: string[];
  }> = [];
  for (const c of configs.filter((x) => x.name.includes(ONLY))) {
    const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-planner-'));
    const server = await startServe(dir, [...c.args, ...ENGINE_ARGS], 'info');
    try {
      const g: number[] = [];
      let failed = 0;
      let cut = 0;
      let first = 0;
      for (const p of phases) {
        say(`bench:planner: ${c.name}, ${p.name}: ${p.requests.length} requests over ${PHASE_S} s`);
        const o = await runPhase(server.base, p, first);
        first += p.requests.length;
        failed += o.filter((x) => !x.ok && !x.cut).length;
        cut += o.filter((x) => x.cut).length;
        g.push(goodput(o));
      }
      const steps = c.name.startsWith('planner') ? actedSteps(server.base) : [];
      rows.push({ config: c.name, goodput: g, failed, cut, steps });
    } finally {
      await stop(server);
      if (KEEP) say(`bench:planner: ${c.name} kept its journal in ${dir}`);
      else rmSync(dir, { recursive: true, force: true });
    }
  }
  const whole = (r: (typeof rows)[number]) =>
    r.goodput.reduce((a, b) => a + b, 0) / r.goodput.length;
  const statics = rows.filter((r) => r.config.startsWith('static'));
  const bestWhole = Math.max(...statics.map(whole));
  const bestPhase = phases.map((_, i) => Math.max(...statics.map((r) => r.goodput[i] ?? 0)));
  if (asJson) {
    process.stdout.write(
      `${JSON.stringify({ phases: phases.map((p) => p.name), rows, bestWhole, bestPhase })}\n`,
    );
    return;
  }
  const head = [
    'config',
    ...phases.map((p) => p.name),
    'whole run',
    'failed',
    'cut',
    'planner steps',
  ];
  const fmt = (n: number, best: number) =>
    `${n.toFixed(2)} (${best > 0 ? (n / best).toFixed(2) : '-'})`;
  const table = rows.map((r) => [
    r.config,
    ...r.goodput.map((g, i) => fmt(g, bestPhase[i] ?? 0)),
    fmt(whole(r), bestWhole),
    String(r.failed),
    String(r.cut),
    r.steps.join(' ') || '-',
  ]);
  const widths = head.map((h, i) =>
    Math.max(h.length, ...table.map((t) => (t[i] as string).length)),
  );
  const print = (cells: string[]) =>
    process.stdout.write(`${cells.map((c, i) => c.padEnd(widths[i] as number)).join('  ')}\n`);
  print(head);
  for (const t of table) print(t);
  process.stdout.write(
    `goodput: requests a second with TTFT ≤ ${SLO_TTFT_MS} ms and ITL ≤ ${SLO_ITL_MS} ms (ratio against the best static split of that column); ${PHASE_S} s a phase (requests unanswered ${GRACE_S} s after it cut), budget ${BUDGET}, prefill ${PREFILL_US} µs/token, decode ${DECODE_US} µs/token on simulated devices\n`,
  );
}

await main();
