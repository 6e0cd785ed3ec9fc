/**
 * `pdctl drill noisy-neighbor` (issue 69): flow control against a tenant that floods. On a fleet
 * of one prefill and one decode engine computing on simulated accelerators (the time is the
 * model's; the CPU runs only the control plane and HTTP): first the fleet's capacity, a batch
 * tenant saturating it; then, one after the other —
 *
 *   solo      an interactive tenant at a quarter of capacity, alone: the baseline;
 *   flood     the same, while a batch tenant floods at 4× capacity: its TTFT p99 against solo's
 *             (target ≤ 1.25×), and none of its requests refused (an invariant);
 *   split     two batch tenants at 10:1 demand (10× and 1× capacity: both backlogged): each one's
 *             share of the tokens answered (target within 10 % of an equal share);
 *   overload  interactive requests at 2× capacity, each asking to wait at most half its TTFT
 *             target (`x-pdctl-queue-ttl-ms`): goodput — answers whose first token came within the
 *             target — against capacity (target ≥ 0.9: no collapse).
 *
 * `npm run bench:tenants` runs the same phases, longer, against a `pdctl serve` process.
 */
import { Agent, request } from 'node:http';
import type { DrillScenario } from './harness.ts';

/** The fleet the figures are for: what the drill's stack and the bench's serve run. */
export const NOISY_FLEET = {
  maxTokens: 16,
  decodeUsPerToken: 10_000,
  roomsPerEngine: 2,
  ttftTargetMs: 1000,
} as const;

export const NOISY_ENGINE_ARGS = [
  '--prefill-compute',
  'device',
  '--decode-compute',
  'device',
  '--decode-us-per-token',
  String(NOISY_FLEET.decodeUsPerToken),
];

interface Answer {
  status: number;
  ttftMs: number;
  tokens: number;
  /** When its answer ended (performance.now()). */
  doneAt: number;
}

const prompt = (i: number) => `request ${i}: the harbor keeps its lanterns lit across the water`;

/** One streamed completion of `key`'s tenant: its status, time to first text, tokens answered. */
function ask(
  base: string,
  agent: Agent,
  key: string,
  i: number,
  headers: Record<string, string> = {},
): Promise<Answer> {
  const body = JSON.stringify({
    model: 'pdctl-deterministic-1',
    prompt: prompt(i),
    max_tokens: NOISY_FLEET.maxTokens,
    stream: true,
    stream_options: { include_usage: true },
  });
  const t0 = performance.now();
  return new Promise((done) => {
    const req = request(
      new URL('/v1/completions', base),
      {
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', authorization: `Bearer ${key}`, ...headers },
      },
      (res) => {
        let first = 0;
        let buf = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          buf += chunk;
          if (!first && /"text":"[^"]/.test(buf)) first = performance.now();
        });
        res.on('end', () => {
          const usage = /"completion_tokens":(\d+)/.exec(buf);
          done({
            status: res.statusCode ?? 0,
            ttftMs: first ? first - t0 : Number.NaN,
            tokens: usage ? Number(usage[1]) : 0,
            doneAt: performance.now(),
          });
        });
        res.on('error', () => undefined);
      },
    );
    req.on('error', () =>
      done({ status: 0, ttftMs: Number.NaN, tokens: 0, doneAt: performance.now() }),
    );
    req.end(body);
  });
}

/** Answers of a phase, and when it began (performance.now()). */
interface Phase {
  answers: Answer[];
  t0: number;
  seconds: number;
}

/**
 * Answers a second that `pred` keeps, of those that ended within the phase after its first second
 * (the fleet filling): a rate of the steady state, not counting the backlog served after it.
 */
function steadyRate(p: Phase, pred: (a: Answer) => boolean = () => true): number {
  const from = p.t0 + 1000;
  const to = p.t0 + p.seconds * 1000;
  return (
    ok(p.answers).filter((a) => a.doneAt >= from && a.doneAt <= to && pred(a)).length /
    (p.seconds - 1)
  );
}

/** `rate` requests a second of `key` for `seconds`, open loop; their answers. */
async function load(
  base: string,
  key: string,
  rate: number,
  seconds: number,
  first: number,
  headers: Record<string, string> = {},
): Promise<Phase> {
  const agent = new Agent({ keepAlive: true, maxSockets: 4096 });
  const t0 = performance.now();
  const out: Array<Promise<Answer>> = [];
  const total = Math.round(rate * seconds);
  for (let i = 0; i < total; i++) {
    const wait = t0 + (i * 1000) / rate - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    out.push(ask(base, agent, key, first + i, headers));
  }
  const answers = await Promise.all(out);
  agent.destroy();
  return { answers, t0, seconds };
}

async function addTenant(
  base: string,
  name: string,
  band: 'interactive' | 'batch',
): Promise<string> {
  const r = await fetch(`${base}/v1/tenants`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ name, band }),
  });
  if (r.status !== 201 && r.status !== 200)
    throw new Error(`adding tenant ${name}: ${r.status} ${await r.text()}`);
  return ((await r.json()) as { key: string }).key;
}

/** The 99th percentile of the answered requests' TTFT (NaN: none answered). */
function p99(a: Answer[]): number {
  const sorted = ok(a)
    .map((x) => x.ttftMs)
    .sort((x, y) => x - y);
  return sorted.length === 0
    ? Number.NaN
    : (sorted[Math.floor(0.99 * (sorted.length - 1))] as number);
}

const ok = (a: Answer[]) => a.filter((x) => x.status === 200 && x.tokens > 0);
const round = (n: number, d = 2) => Math.round(n * 10 ** d) / 10 ** d;

/** The phases' figures, each with its baseline, ratio and target. */
export interface NoisyFigures {
  capacityPerS: number;
  rows: Array<{
    figure: string;
    value: number;
    baseline: number;
    ratio: number | null;
    target: string;
    holds: boolean;
  }>;
  floodAnswered: number;
  floodRefused: number;
  overloadRefused: number;
}

/** Runs the phases against the serving API at `base` (tenants are added there). */
export async function noisyNeighbor(
  base: string,
  phaseS: number,
  progress: (line: string) => void = () => {},
): Promise<NoisyFigures> {
  const { maxTokens, decodeUsPerToken, roomsPerEngine, ttftTargetMs } = NOISY_FLEET;
  let n = 0;
  const [chat, bulk, heavy, light, probe] = await Promise.all([
    addTenant(base, 'noisy-chat', 'interactive'),
    addTenant(base, 'noisy-bulk', 'batch'),
    addTenant(base, 'noisy-heavy', 'batch'),
    addTenant(base, 'noisy-light', 'batch'),
    addTenant(base, 'noisy-probe', 'batch'),
  ]);
  const asked = (roomsPerEngine * 1000) / ((maxTokens * decodeUsPerToken) / 1000);
  progress(`capacity: ${phaseS} s of a batch tenant at ${round(asked * 2)} requests a second`);
  const sat = await load(base, probe, asked * 2, phaseS, n, { 'x-pdctl-queue-ttl-ms': '2000' });
  n += sat.answers.length;
  const capacity = steadyRate(sat);
  if (capacity === 0)
    throw new Error('the fleet answered nothing while saturated: no capacity to measure against');

  progress(`solo: an interactive tenant at ${round(capacity / 4)}/s`);
  const solo = (await load(base, chat, capacity / 4, phaseS, n)).answers;
  n += solo.length;

  progress(`flood: the same, and a batch tenant at ${round(capacity * 4)}/s`);
  const [withFlood, flood] = (
    await Promise.all([
      load(base, chat, capacity / 4, phaseS, n),
      load(base, bulk, capacity * 4, phaseS, n + 100_000, { 'x-pdctl-queue-ttl-ms': '5000' }),
    ])
  ).map((p) => p.answers) as [Answer[], Answer[]];
  n += 200_000;

  progress(`split: batch tenants at ${round(capacity * 10)}/s and ${round(capacity)}/s`);
  const [heavyA, lightA] = (
    await Promise.all([
      load(base, heavy, capacity * 10, phaseS, n, { 'x-pdctl-queue-ttl-ms': '5000' }),
      load(base, light, capacity, phaseS, n + 100_000, { 'x-pdctl-queue-ttl-ms': '5000' }),
    ])
  ).map((p) => p.answers) as [Answer[], Answer[]];
  n += 200_000;
  const tokens = (a: Answer[]) => ok(a).reduce((s, x) => s + x.tokens, 0);
  const split = tokens(heavyA) + tokens(lightA);

  progress(
    `overload: interactive at ${round(capacity * 2)}/s, each waiting ${ttftTargetMs / 2} ms at most`,
  );
  const over = await load(base, chat, capacity * 2, phaseS, n, {
    'x-pdctl-queue-ttl-ms': String(ttftTargetMs / 2),
  });
  const good = steadyRate(over, (x) => x.ttftMs <= ttftTargetMs);
  const share = (a: Answer[]) => (split === 0 ? 0 : tokens(a) / split);
  /** A tenant's share of the tokens answered at 10:1 demand, against an equal share. */
  const shareRow = (who: string, a: Answer[]) => ({
    figure: `${who} tenant share of tokens (10:1 demand)`,
    value: round(share(a)),
    baseline: 0.5,
    ratio: round(share(a) / 0.5),
    target: '0.9–1.1',
    holds: Math.abs(share(a) / 0.5 - 1) <= 0.1,
  });
  return {
    capacityPerS: round(capacity, 1),
    rows: [
      {
        figure: 'interactive TTFT p99 (ms)',
        value: round(p99(withFlood), 1),
        baseline: round(p99(solo), 1),
        ratio: round(p99(withFlood) / p99(solo)),
        target: '≤ 1.25',
        holds: p99(withFlood) / p99(solo) <= 1.25,
      },
      {
        figure: 'interactive refused under the flood',
        value: withFlood.length - ok(withFlood).length,
        baseline: solo.length - ok(solo).length,
        ratio: null,
        target: '0',
        holds: withFlood.length === ok(withFlood).length,
      },
      shareRow('heavy', heavyA),
      shareRow('light', lightA),
      {
        figure: `goodput at 2× capacity (answers/s, TTFT ≤ ${ttftTargetMs} ms)`,
        value: round(good, 1),
        baseline: round(capacity, 1),
        ratio: round(good / capacity),
        target: '≥ 0.9',
        holds: good / capacity >= 0.9,
      },
    ],
    floodAnswered: ok(flood).length,
    floodRefused: flood.length - ok(flood).length,
    overloadRefused: over.answers.filter((x) => x.status === 429).length,
  };
}

export const noisyNeighborDrill: DrillScenario = {
  name: 'noisy-neighbor',
  summary:
    'a batch tenant floods at 4× capacity: interactive TTFT and refusals against its solo run, fair shares at 10:1 demand, goodput at 2× overload',
  remote: {
    unsupported:
      'its figures are against the fleet it starts (one prefill and one decode engine on simulated accelerators); npm run bench:tenants runs them against a pdctl serve',
  },
  engineArgs: NOISY_ENGINE_ARGS,
  // A canary would take one of the two room slots the phases measure, and fail for want of it.
  canaryIntervalMs: 0,
  stack: {
    prefillEngines: 1,
    decodeEngines: 1,
    maxRoomsPerEngine: NOISY_FLEET.roomsPerEngine,
  },
  async run(ctx) {
    const phaseS = 5;
    const f = await noisyNeighbor(ctx.base, phaseS, (line) => ctx.mark(line));
    ctx.mark(
      `capacity ${f.capacityPerS} answers/s; the flood: ${f.floodAnswered} answered, ${f.floodRefused} refused; overload: ${f.overloadRefused} refused at their time-to-live`,
    );
    for (const r of f.rows)
      ctx.check({
        name: r.figure,
        ok: r.holds,
        figure: {
          value: r.value,
          baseline: r.baseline,
          ...(r.ratio === null ? {} : { ratio: r.ratio }),
          target: r.target,
        },
        detail: `${phaseS} s phases, against the same run's ${r.figure.startsWith('interactive') ? 'solo phase' : r.figure.startsWith('goodput') ? 'capacity' : 'equal share'}`,
        // Refusing an interactive request for a batch tenant's flood is a defect; the rest are
        // figures against targets, which a shared machine moves.
        ...(r.figure.startsWith('interactive refused') ? {} : { target: true }),
      });
  },
};
