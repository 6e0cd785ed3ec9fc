/**
 * The simulator's clients (issue 41, item 3): a seeded workload — arrivals as a Poisson process,
 * prompts that share prefixes as real traffic does (a system prompt, a few-shot preamble), their
 * lengths and answer lengths drawn from ranges, streaming and non-streaming clients, and clients
 * that abort or disconnect part way. Every request follows from the seed: the same seed gives the
 * same requests, in the same order, at the same virtual times.
 */
import { WORDS } from '../model/words.ts';
import type { Random } from '../ports/random.ts';
import type { Band } from '../tenants/book.ts';

/** A tenant of the simulated API: its band and its own limits, as `pdctl tenants add` sets them. */
export interface SimTenant {
  name: string;
  band: Band;
  maxConcurrency: number | null;
  tokensPerMinute: number | null;
}

export interface WorkloadOptions {
  /** How many requests. */
  requests: number;
  /** Mean arrivals per second of virtual time. */
  perSecond: number;
  /** How many prefixes the prompts share, and the share of prompts that start with one. */
  prefixes: number;
  prefixShare: number;
  /** Words in a shared prefix, and in the rest of a prompt (inclusive ranges). */
  prefixWords: readonly [number, number];
  promptWords: readonly [number, number];
  maxTokens: readonly [number, number];
  /** Shares of clients that stream, that abort (an AbortReq), that disconnect mid-answer. */
  streamShare: number;
  abortShare: number;
  disconnectShare: number;
  /** The latest an aborting or disconnecting client acts after it asked, in ms. */
  actWithinMs: number;
  /** Whose requests they are, each drawn evenly; none: an open API. */
  tenants: readonly SimTenant[];
}

export const DEFAULT_WORKLOAD: Readonly<WorkloadOptions> = Object.freeze({
  requests: 200,
  perSecond: 50,
  prefixes: 4,
  prefixShare: 0.6,
  prefixWords: [16, 64] as const,
  promptWords: [4, 48] as const,
  maxTokens: [1, 24] as const,
  streamShare: 0.5,
  abortShare: 0.05,
  disconnectShare: 0.05,
  actWithinMs: 200,
  tenants: [],
});

export interface ClientRequest {
  /** A request id of its own (`x-request-id`). */
  id: string;
  /** When it arrives, in ms from the start of the run. */
  at: number;
  prompt: string;
  /** The shared prefix it starts with (its index), or null. */
  prefix: number | null;
  maxTokens: number;
  stream: boolean;
  /** What the client does part way, if anything, and how long after it asked. */
  action: { kind: 'abort' | 'disconnect'; afterMs: number } | null;
  /** The tenant whose key it comes with; null: an open API. */
  tenant: string | null;
}

/** The requests of a run, in arrival order. Throws a RangeError that names a bad option. */
export function workload(random: Random, options: Partial<WorkloadOptions> = {}): ClientRequest[] {
  const o = checked({ ...DEFAULT_WORKLOAD, ...options });
  // Each part draws from its own stream: changing how prompts are drawn leaves arrivals as they were.
  const arrivals = random.fork('arrivals');
  const texts = random.fork('prompts');
  const clients = random.fork('clients');
  const owners = random.fork('tenants');
  const words = (r: Random, [lo, hi]: readonly [number, number]) =>
    Array.from({ length: r.between(lo, hi) }, () => r.pick(WORDS)).join(' ');
  const prefixes = Array.from({ length: o.prefixes }, () => words(texts, o.prefixWords));
  const requests: ClientRequest[] = [];
  let at = 0;
  for (let i = 0; i < o.requests; i++) {
    // Exponential gaps: a Poisson process of the given rate (1 - next() is never 0).
    at += (-Math.log(1 - arrivals.next()) * 1000) / o.perSecond;
    const prefix = o.prefixes > 0 && texts.chance(o.prefixShare) ? texts.int(o.prefixes) : null;
    const rest = words(texts, o.promptWords);
    const u = clients.next();
    const kind =
      u < o.abortShare ? 'abort' : u < o.abortShare + o.disconnectShare ? 'disconnect' : null;
    requests.push({
      id: `sim-${i.toString().padStart(6, '0')}`,
      at: Math.round(at),
      prompt: prefix === null ? rest : `${prefixes[prefix]} ${rest}`,
      prefix,
      maxTokens: clients.between(o.maxTokens[0], o.maxTokens[1]),
      stream: clients.chance(o.streamShare),
      action: kind === null ? null : { kind, afterMs: clients.between(0, o.actWithinMs) },
      tenant: o.tenants.length === 0 ? null : owners.pick(o.tenants).name,
    });
  }
  return requests;
}

/**
 * The tenants of a seed: none (an open API) one seed in four, else one to three, each in a band
 * and with or without each of its own limits — tight enough, when drawn, that they hold.
 */
export function drawTenants(random: Random): SimTenant[] {
  if (random.chance(0.25)) return [];
  return Array.from({ length: random.between(1, 3) }, (_, i) => ({
    name: `tenant-${i}`,
    band: random.chance(0.6) ? 'interactive' : 'batch',
    maxConcurrency: random.chance(0.5) ? random.between(1, 8) : null,
    tokensPerMinute: random.chance(0.3) ? random.between(10, 60) * 100 : null,
  }));
}

/** The tenant a `flood` fault sends as: a batch tenant with no limits of its own. */
export const FLOOD_TENANT: SimTenant = Object.freeze({
  name: 'flood',
  band: 'batch',
  maxConcurrency: null,
  tokensPerMinute: null,
});

/**
 * A flood by one tenant (the `flood` fault): requests of `FLOOD_TENANT` arriving at `perSecond`
 * from `at` for `forMs` (ms from the run's start), shaped as the workload's are, none leaving.
 */
export function flood(
  random: Random,
  o: { at: number; forMs: number; perSecond: number; first: number },
  shape: Partial<WorkloadOptions> = {},
): ClientRequest[] {
  const w = checked({ ...DEFAULT_WORKLOAD, ...shape });
  const out: ClientRequest[] = [];
  let at = o.at;
  for (let i = o.first; ; i++) {
    at += (-Math.log(1 - random.next()) * 1000) / o.perSecond;
    if (at > o.at + o.forMs) return out;
    out.push({
      id: `flood-${i.toString().padStart(6, '0')}`,
      at: Math.round(at),
      prompt: Array.from({ length: random.between(w.promptWords[0], w.promptWords[1]) }, () =>
        random.pick(WORDS),
      ).join(' '),
      prefix: null,
      maxTokens: random.between(w.maxTokens[0], w.maxTokens[1]),
      stream: random.chance(w.streamShare),
      action: null,
      tenant: FLOOD_TENANT.name,
    });
  }
}

function checked(o: WorkloadOptions): WorkloadOptions {
  const whole = (name: string, v: number, min: number) => {
    if (!Number.isInteger(v) || v < min)
      throw new RangeError(`${name} must be a whole number ≥ ${min}, got ${v}`);
  };
  const share = (name: string, v: number) => {
    if (!(v >= 0 && v <= 1)) throw new RangeError(`${name} must be a share from 0 to 1, got ${v}`);
  };
  const range = (name: string, [lo, hi]: readonly [number, number], min: number) => {
    whole(`${name}[0]`, lo, min);
    whole(`${name}[1]`, hi, lo);
  };
  whole('requests', o.requests, 0);
  if (!(o.perSecond > 0 && Number.isFinite(o.perSecond)))
    throw new RangeError(`perSecond must be a rate above 0, got ${o.perSecond}`);
  whole('prefixes', o.prefixes, 0);
  share('prefixShare', o.prefixShare);
  range('prefixWords', o.prefixWords, 1);
  range('promptWords', o.promptWords, 1);
  range('maxTokens', o.maxTokens, 1);
  share('streamShare', o.streamShare);
  share('abortShare', o.abortShare);
  share('disconnectShare', o.disconnectShare);
  share('abortShare + disconnectShare', o.abortShare + o.disconnectShare);
  whole('actWithinMs', o.actWithinMs, 0);
  return o;
}
