/**
 * Request traces in the Mooncake format (../shared/traces/README.md): one JSON object per line,
 * `timestamp` (ms from the trace's start), `input_length`, `output_length` and `hash_ids` (the
 * prompt's prefix blocks; equal ids mean the same prefix): reading a trace with errors that name
 * the line, the trace's own bound on prefix reuse — the share of blocks whose prefix appeared
 * earlier in the trace, as a perfect router with an infinite cache would reuse them — and the
 * trace as the events a fleet would have journaled serving it, for `pdctl plan --trace`
 * (`bench:trace-replay` replays it against a real stack instead).
 */
import { createReadStream } from 'node:fs';
import { createInterface } from 'node:readline';
import type { JournalEvent } from '../room/events.ts';

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

/** What serving a trace costs, per token (as `pdctl serve --prefill-us-per-token` sets an engine's). */
export interface TraceCosts {
  prefillUsPerToken: number;
  decodeUsPerToken: number;
}

/** Tokens of one `hash_ids` block (../shared/traces/README.md). */
export const TRACE_BLOCK_TOKENS = 512;

/**
 * The events a fleet would have journaled serving `requests` with nothing queued: at arrival
 * (`start` + timestamp) its room is created; its prefill computes the tokens of blocks not seen
 * before in the trace (an infinite cache, perfect routing: the reuse bound) and posts the KV; its
 * decode computes `output_length` tokens and completes. No decode start is recorded: the time a
 * room waited is not in a trace, so no latency is made up. In time order.
 */
export function traceEvents(
  requests: readonly TraceRequest[],
  costs: TraceCosts,
  start: number,
): JournalEvent[] {
  const seen = new Set<number>();
  const out: JournalEvent[] = [];
  const envelope = (ts: number, room: string) => ({ seq: 0, ts, room, engine: null, eventId: '' });
  requests.forEach((r, i) => {
    const room = `trace-${i}`;
    const at = start + r.timestamp;
    let reused = 0;
    for (const id of r.hashIds) {
      if (seen.has(id)) reused++;
      else seen.add(id);
    }
    const computed = Math.max(0, r.inputLength - reused * TRACE_BLOCK_TOKENS);
    const prefillMicros = computed * costs.prefillUsPerToken;
    const decodeMicros = r.outputLength * costs.decodeUsPerToken;
    const posted = at + Math.round(prefillMicros / 1000);
    out.push(
      {
        ...envelope(at, room),
        type: 'room.created',
        source: 'trace',
        data: {
          prefillEngine: 'prefill',
          decodeEngine: 'decode',
          promptTokens: r.inputLength,
          prefixBlocks: r.hashIds.length,
        },
      },
      {
        ...envelope(posted, room),
        type: 'room.transfer_posted',
        source: 'trace',
        data: { computeMicros: prefillMicros, reusedBlocks: reused },
      },
      {
        ...envelope(posted + Math.round(decodeMicros / 1000), room),
        type: 'room.completed',
        source: 'trace',
        data: { tokens: r.outputLength, finishReason: 'length', computeMicros: decodeMicros },
      },
    );
  });
  out.sort((a, b) => a.ts - b.ts);
  out.forEach((ev, i) => {
    ev.seq = i + 1;
  });
  return out;
}
