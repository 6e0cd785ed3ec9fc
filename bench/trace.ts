/**
 * Request traces in the Mooncake format (../shared/traces/README.md): one JSON object per line,
 * `timestamp` (ms from the trace's start), `input_length`, `output_length` and `hash_ids` (the
 * prompt's prefix blocks; equal ids mean the same prefix). The first step of `bench:trace`
 * (issue 30): reading a trace with errors that name the line, and the trace's own bound on prefix
 * reuse — the share of blocks whose prefix appeared earlier in the trace, as a perfect router with
 * an infinite cache would reuse them.
 */
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';

export interface TraceRequest {
  /** Arrival, in ms from the trace's start. */
  timestamp: number;
  inputLength: number;
  outputLength: number;
  hashIds: number[];
}

export class TraceError extends Error {
  override name = 'TraceError';
}

/** One line of a trace, checked; throws a TraceError naming the line and what is wrong. */
export function parseTraceLine(text: string, line: number, where = 'trace'): TraceRequest {
  const bad = (what: string) =>
    new TraceError(
      `${where}:${line}: ${what}; each line must be {"timestamp", "input_length", "output_length", "hash_ids"} (../shared/traces/README.md)`,
    );
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (err) {
    throw bad(`not JSON (${(err as Error).message})`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw bad('not a JSON object');
  const o = v as Record<string, unknown>;
  const count = (k: string) => {
    const x = o[k];
    if (typeof x !== 'number' || !Number.isSafeInteger(x) || x < 0)
      throw bad(`${k} must be a non-negative integer, got ${JSON.stringify(x)}`);
    return x;
  };
  const timestamp = count('timestamp');
  const inputLength = count('input_length');
  const outputLength = count('output_length');
  const ids = o.hash_ids;
  if (!Array.isArray(ids) || !ids.every((x) => Number.isSafeInteger(x) && (x as number) >= 0))
    throw bad('hash_ids must be a list of non-negative integers');
  return { timestamp, inputLength, outputLength, hashIds: ids as number[] };
}

/**
 * The first `limit` requests of a trace file (all when omitted), in file order; arrivals must not
 * go back in time. Blank lines are skipped.
 */
export async function readTrace(
  path: string,
  limit = Number.POSITIVE_INFINITY,
): Promise<TraceRequest[]> {
  const out: TraceRequest[] = [];
  const lines = createInterface({
    input: createReadStream(path),
    crlfDelay: Number.POSITIVE_INFINITY,
  });
  let line = 0;
  for await (const text of lines) {
    line++;
    if (text.trim() === '') continue;
    const r = parseTraceLine(text, line, path);
    const last = out.at(-1);
    if (last && r.timestamp < last.timestamp)
      throw new TraceError(
        `${path}:${line}: timestamp ${r.timestamp} is before the previous request's ${last.timestamp}; a trace is in arrival order`,
      );
    out.push(r);
    if (out.length >= limit) break;
  }
  lines.close();
  return out;
}

/**
 * The share of prompt blocks whose prefix appeared earlier in the trace (the same hash id, which
 * names the whole prefix up to that block): what a perfect router with an infinite cache would
 * not compute again. Blocks, not tokens: every block is counted whole.
 */
export function hitRateBound(requests: readonly TraceRequest[]): {
  blocks: number;
  seenBefore: number;
  bound: number;
} {
  const seen = new Set<number>();
  let blocks = 0;
  let seenBefore = 0;
  for (const r of requests) {
    for (const id of r.hashIds) {
      blocks++;
      if (seen.has(id)) seenBefore++;
      else seen.add(id);
    }
  }
  return { blocks, seenBefore, bound: blocks === 0 ? 0 : seenBefore / blocks };
}
