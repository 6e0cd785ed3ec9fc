/** What the benchmark scripts share: their flags, progress on stderr, percentiles, open-loop load. */
import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';

export const argv = process.argv.slice(2);
/** Every flag the script has read so far (`checkFlags` refuses the others). */
const known = new Set(['--help', '--json']);
/** `--json`: print one JSON object with stable keys instead of a table. */
export const asJson = argv.includes('--json');

/** The value after `--name`, or `dflt`. */
export function flag(name: string, dflt: string): string {
  known.add(name);
  const i = argv.indexOf(name);
  return i >= 0 && argv[i + 1] ? (argv[i + 1] as string) : dflt;
}

/** Whether the switch `--name` was given. */
export function has(name: string): boolean {
  known.add(name);
  return argv.includes(name);
}

/**
 * Call once every flag has been read and before any work: `--help` prints the script's opening
 * comment (its usage) and exits; a flag the script never read exits 2 naming the ones it knows —
 * a mistyped or unknown flag must not start a half-hour run with the defaults.
 */
export function checkFlags(): void {
  const script = process.argv[1] as string;
  const name = script.replace(/^.*\//, '');
  if (argv.includes('--help') || argv.includes('-h')) {
    const head = /\/\*\*([\s\S]*?)\*\//.exec(readFileSync(script, 'utf8'));
    const usage = (head?.[1] ?? '').replace(/^[ \t]*\* ?/gm, '').trim();
    process.stdout.write(`${usage || name}\n\nFlags it reads: ${[...known].sort().join(' ')}\n`);
    process.exit(0);
  }
  const unknown = argv.filter((a) => a.startsWith('--') && !known.has(a));
  if (unknown.length > 0) {
    process.stderr.write(
      `${name}: unknown flag ${unknown.join(', ')}; it reads ${[...known].sort().join(' ')} (--help for usage)\n`,
    );
    process.exit(2);
  }
}

/** Progress for a human; silent with --json so that stdout stays one object. */
export function say(s: string): void {
  if (!asJson) process.stderr.write(`${s}\n`);
}

/** The p-th percentile of values sorted ascending (NaN when there are none). */
export function percentile(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number;
}

/**
 * The median of a histogram given as counts by bucket (`counts[b]`: how many fell in bucket b): the
 * bucket where half the total is reached; null when it is empty.
 */
export function medianBucket(counts: readonly number[]): number | null {
  const total = counts.reduce((a, b) => a + b, 0);
  if (total === 0) return null;
  let seen = 0;
  for (const [bucket, n] of counts.entries()) {
    seen += n;
    if (seen * 2 >= total) return bucket;
  }
  return null;
}

/**
 * Calls `send(i, due)` for request i at its due time, `rate` a second for `seconds`, without
 * waiting for answers; resolves when every returned promise has settled.
 */
export async function atRate(
  rate: number,
  seconds: number,
  send: (i: number, due: number) => Promise<void>,
): Promise<void> {
  const t0 = performance.now();
  const total = Math.round(rate * seconds);
  const pending: Array<Promise<void>> = [];
  for (let i = 0; i < total; i++) {
    const due = t0 + (i * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 1) await new Promise((r) => setTimeout(r, wait));
    pending.push(send(i, due));
  }
  await Promise.all(pending);
}

/** The machine's CPU time so far (every process, every thread, the kernel), in ms. */
export function machineCpuMs(): number {
  return cpus().reduce((n, { times: t }) => n + t.user + t.nice + t.sys + t.irq, 0);
}
