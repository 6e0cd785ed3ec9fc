/**
 * The HTTP load generator of `bench:serve`, in a process of its own so that the server's event
 * loop carries only the API and the control plane (the client's parsing and bookkeeping are not
 * the HTTP layer's overhead). Keep-alive connections, one request at a time on each, as a load
 * tool such as wrk does; or, with `rate`, requests sent on a fixed schedule whatever the answers
 * (an open loop, as users arrive). Driven over IPC: one job in, one result out, until disconnected.
 */
import { Agent, request } from 'node:http';
import { atRate } from './args.ts';

export interface ClientJob {
  base: string;
  model: string;
  connections: number;
  seconds: number;
  maxTokens: number;
  /** `complete`: time to the whole JSON answer; `stream`: time to the first token's chunk. */
  mode: 'complete' | 'stream';
  /**
   * Requests per second on a fixed schedule instead of `connections` closed loops. Each time is
   * measured from when its request was due, so a server that falls behind shows it.
   */
  rate?: number;
  /** Words in each prompt (default about 10). */
  promptWords?: number;
}

export interface ClientResult {
  /** Per-request times, ms, sorted ascending. */
  ms: number[];
  rps: number;
  errors: number;
  /** The first error seen, for the log. */
  firstError: string | null;
  /** This (the client's) process's CPU per answered request, ms: what HTTP costs its caller. */
  cpuMsPerRequest: number;
}

const line = (i: number) => `the harbor keeps ${i % 97} lanterns lit across the quiet water`;
/** A prompt of about `words` words (10 per line), different for each request. */
const prompt = (i: number, words = 10) =>
  Array.from({ length: Math.max(1, Math.round(words / 10)) }, (_, k) => line(i + k)).join(' ');

/** Sends request `i`; resolves with ms from `t` (default: now) to the answer or first token. */
function one(job: ClientJob, agent: Agent, i: number, t = performance.now()): Promise<number> {
  const url = new URL('/v1/completions', job.base);
  const body = JSON.stringify({
    model: job.model,
    prompt: prompt(i, job.promptWords),
    max_tokens: job.maxTokens,
    stream: job.mode === 'stream',
  });
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      {
        method: 'POST',
        agent,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
      },
      (res) => {
        let first = Number.NaN;
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          if (job.mode === 'stream') {
            if (Number.isNaN(first) && chunk.includes('"text":" ')) first = performance.now() - t;
          } else text += chunk;
        });
        res.on('end', () => {
          if (res.statusCode !== 200)
            reject(new Error(`HTTP ${res.statusCode}: ${text.slice(0, 200)}`));
          else if (job.mode === 'stream') resolve(first);
          else {
            JSON.parse(text);
            resolve(performance.now() - t);
          }
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

async function run(job: ClientJob): Promise<ClientResult> {
  const agent = new Agent({ keepAlive: true, maxSockets: job.rate ? 256 : job.connections });
  const ms: number[] = [];
  let errors = 0;
  let firstError: string | null = null;
  const record = (p: Promise<number>) =>
    p.then(
      (t) => void ms.push(t),
      (err: Error) => {
        errors++;
        firstError ??= err.message;
      },
    );
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const end = t0 + job.seconds * 1000;
  if (job.rate) {
    await atRate(job.rate, job.seconds, (i, due) => record(one(job, agent, i, due)));
  } else {
    await Promise.all(
      Array.from({ length: job.connections }, async (_, c) => {
        for (let i = 0; performance.now() < end; i++)
          await record(one(job, agent, c * 100_000 + i));
      }),
    );
  }
  const rps = ms.length / ((performance.now() - t0) / 1000);
  agent.destroy();
  const cpu = process.cpuUsage(cpu0);
  ms.sort((a, b) => a - b);
  const cpuMsPerRequest = (cpu.user + cpu.system) / 1000 / Math.max(1, ms.length);
  return { ms, rps, errors, firstError, cpuMsPerRequest };
}

process.on('message', (job: ClientJob) => {
  void run(job).then((r) => process.send?.(r));
});
process.on('disconnect', () => process.exit(0));
