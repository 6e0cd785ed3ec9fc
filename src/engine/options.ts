/**
 * The engine's one options object: defaults in one place, units in names, validated once at start
 * and then frozen. CLI flags map onto it (src/cli/engine-command.ts).
 */

import { availableParallelism } from 'node:os';
import type { KvSend } from '../bus/protocol.ts';
import { HEARTBEAT_MS } from '../bus/protocol.ts';
import { COMPUTE, DEFAULT_MODEL_OPTIONS, type ModelOptions } from '../model/deterministic.ts';
import { PREFIX_REUSE_MODES, type PrefixReuseMode } from '../model/prefix-blocks.ts';
import { isValidId } from '../room/ids.ts';
import { defaultPoolName } from '../transfer/pool.ts';

export type EngineRole = 'prefill' | 'decode';

export interface EngineOptions extends ModelOptions {
  id: string;
  role: EngineRole;
  /**
   * The control plane's bus endpoint, e.g. `tcp://127.0.0.1:5557`; or, comma-separated, those of
   * every control plane sharing a PostgreSQL journal: the engine follows whichever leads.
   */
  control: string;
  /** KV pool size and page size (bytes, a multiple of 64 and of kvBytesPerToken). */
  pages: number;
  pageBytes: number;
  /** Shared-memory name of this engine's pool; default `/pdctl-<id>-<pid>`. */
  poolName: string;
  /**
   * CUDA device for the KV pool's pages (a device pool, docs/cuda.md); null: host shared memory.
   * Engines of one stack may differ: the transfer core moves pages between any two kinds of pool.
   */
  kvDevice: number | null;
  /**
   * How KV reaches another engine's pool: `shm` (shared memory, the same host), `ucx` (UCX, any
   * host), or `auto` (shared memory where the peer's pool is on this host, UCX where it is not,
   * when UCX is available here). A decode engine that may receive over UCX opens a UCX node and
   * says so in its hello.
   */
  kvTransport: KvSend;
  /** Copy threads of the transfer core (prefill). */
  transferThreads: number;
  /** Rooms computing or transferring at once (prefill). */
  prefillConcurrency: number;
  /** Rooms waiting for prefill beyond which new ones fail with `prefill_queue_full`. */
  maxQueue: number;
  /**
   * Tokens per prefix block (model/prefix-blocks.ts): the unit a prefill engine caches and the
   * router counts. Every engine and the control plane of a stack need the same.
   */
  kvBlockTokens: number;
  /**
   * Pool pages a prefill engine may keep cached prefix blocks in (engine/prefix-cache.ts); null: a
   * quarter of the pool; 0: no prefix cache. Rooms come first: cached blocks give their pages up.
   */
  prefixCachePages: number | null;
  /**
   * llama.cpp: whether a prefill engine's sequences keep prompts for the next to continue from;
   * `auto`: where the model's check at start finds continuing cheaper than computing again.
   * `prefixCachePages: 0` turns it off whatever this says.
   */
  prefixReuse: PrefixReuseMode;
  /** Tokens per streamed chunk (decode). */
  chunkTokens: number;
  heartbeatMs: number;
  /** How often a spawned engine checks that its parent (`PDCTL_EXIT_WITH_PARENT`) still lives. */
  parentCheckMs: number;
  /** How long SIGTERM waits for rooms in flight before exiting anyway. */
  drainTimeoutMs: number;
  /** Accept `inject_fault` commands (drills). Off by default: a production engine refuses them. */
  allowFaultInjection: boolean;
  /** A GGUF model file served with llama.cpp; null: the built-in deterministic model. */
  model: string | null;
  /** llama.cpp: sequences of the engine's context, the rooms it computes at once. */
  sequences: number;
  /** llama.cpp: tokens one room may hold; null: the model's training context, at most 4096. */
  contextSize: number | null;
  /** llama.cpp: CPU threads; 0: llama.cpp's default (the machine's cores). */
  threads: number;
  /** llama.cpp: `auto` uses a GPU where there is one (CUDA build), `cpu` never does. */
  gpu: 'auto' | 'cpu';
}

export const ENGINE_DEFAULTS = Object.freeze({
  ...DEFAULT_MODEL_OPTIONS,
  pages: 4096,
  pageBytes: 4096,
  kvTransport: 'auto' as KvSend,
  transferThreads: 2,
  prefillConcurrency: 8,
  maxQueue: 10_000,
  kvBlockTokens: 64,
  prefixCachePages: null as number | null,
  prefixReuse: 'auto' as PrefixReuseMode,
  chunkTokens: 4,
  heartbeatMs: HEARTBEAT_MS,
  parentCheckMs: 500,
  drainTimeoutMs: 30_000,
  allowFaultInjection: false,
  kvDevice: null as number | null,
  model: null as string | null,
  sequences: 4,
  contextSize: null as number | null,
  threads: 0,
  gpu: 'auto' as 'auto' | 'cpu',
});

export class EngineOptionsError extends Error {
  override name = 'EngineOptionsError';
}

const KEYS = new Set<string>([
  ...Object.keys(ENGINE_DEFAULTS),
  'id',
  'role',
  'control',
  'poolName',
]);

function closest(key: string): string {
  let best = '';
  let bestScore = Number.POSITIVE_INFINITY;
  for (const k of KEYS) {
    const d = distance(key.toLowerCase(), k.toLowerCase());
    if (d < bestScore) {
      bestScore = d;
      best = k;
    }
  }
  return best;
}

function distance(a: string, b: string): number {
  const dp = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    let prev = dp[0] as number;
    dp[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const cur = dp[j] as number;
      dp[j] = Math.min(cur + 1, (dp[j - 1] as number) + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = cur;
    }
  }
  return dp[b.length] as number;
}

function int(name: string, v: unknown, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
    throw new EngineOptionsError(
      `${name} must be an integer from ${min} to ${max}, got ${String(v)}`,
    );
  }
  return v;
}

function bool(name: string, v: unknown): boolean {
  if (typeof v !== 'boolean')
    throw new EngineOptionsError(`${name} must be true or false, got ${String(v)}`);
  return v;
}

function nonEmpty(name: string, v: unknown): string {
  if (typeof v !== 'string' || v.length === 0)
    throw new EngineOptionsError(`${name} must be a file path, got ${JSON.stringify(v)}`);
  return v;
}

function badTransport(v: unknown): never {
  throw new EngineOptionsError(`kvTransport must be auto, shm or ucx, got ${JSON.stringify(v)}`);
}

function oneOf(name: string, choices: readonly string[], v: unknown): never {
  throw new EngineOptionsError(`${name} must be ${choices.join(' or ')}, got ${JSON.stringify(v)}`);
}

function compute(name: string, v: unknown): EngineOptions['prefillCompute'] {
  return COMPUTE.includes(v as never)
    ? (v as EngineOptions['prefillCompute'])
    : oneOf(name, COMPUTE, v);
}

/** Fills defaults, checks every field, and freezes. Unknown keys name the closest valid one. */
export function resolveEngineOptions(input: Record<string, unknown>): Readonly<EngineOptions> {
  for (const key of Object.keys(input)) {
    if (!KEYS.has(key)) {
      throw new EngineOptionsError(
        `unknown engine option "${key}"; did you mean "${closest(key)}"?`,
      );
    }
  }
  const given = Object.fromEntries(Object.entries(input).filter(([, v]) => v !== undefined));
  const o = { ...ENGINE_DEFAULTS, ...given } as Record<string, unknown>;
  if (typeof o.id !== 'string' || !isValidId(o.id)) {
    throw new EngineOptionsError(
      `id must be letters, digits and . _ : @ / - (at most 128), got ${JSON.stringify(o.id)}`,
    );
  }
  if (o.role !== 'prefill' && o.role !== 'decode') {
    throw new EngineOptionsError(`role must be prefill or decode, got ${JSON.stringify(o.role)}`);
  }
  if (
    typeof o.control !== 'string' ||
    !o.control.split(',').every((e) => /^(tcp|ipc):\/\/[^,\s]+$/.test(e))
  ) {
    throw new EngineOptionsError(
      `control must be a tcp:// or ipc:// endpoint, or several separated by commas, got ${JSON.stringify(o.control)}`,
    );
  }
  const pageBytes = int('pageBytes', o.pageBytes, 64, 64 << 20);
  if (pageBytes % 64 !== 0)
    throw new EngineOptionsError(`pageBytes must be a multiple of 64, got ${pageBytes}`);
  const kv = int('kvBytesPerToken', o.kvBytesPerToken, 4, pageBytes);
  if (kv % 4 !== 0 || pageBytes % kv !== 0) {
    throw new EngineOptionsError(
      `kvBytesPerToken (${kv}) must be a multiple of 4 that divides pageBytes (${pageBytes})`,
    );
  }
  const pages = int('pages', o.pages, 1, 1 << 24);
  const options: EngineOptions = {
    id: o.id,
    role: o.role,
    control: o.control,
    pages,
    pageBytes,
    poolName: typeof o.poolName === 'string' ? o.poolName : defaultPoolName(o.id, process.pid),
    kvBytesPerToken: kv,
    prefillUsPerToken: int('prefillUsPerToken', o.prefillUsPerToken, 0, 1_000_000),
    decodeUsPerToken: int('decodeUsPerToken', o.decodeUsPerToken, 0, 1_000_000),
    prefillCompute: compute('prefillCompute', o.prefillCompute),
    decodeCompute: compute('decodeCompute', o.decodeCompute),
    kvTransport:
      o.kvTransport === 'auto' || o.kvTransport === 'shm' || o.kvTransport === 'ucx'
        ? o.kvTransport
        : badTransport(o.kvTransport),
    transferThreads: int('transferThreads', o.transferThreads, 1, 64),
    prefillConcurrency: int('prefillConcurrency', o.prefillConcurrency, 1, 4096),
    maxQueue: int('maxQueue', o.maxQueue, 1, 10_000_000),
    kvBlockTokens: int('kvBlockTokens', o.kvBlockTokens, 1, 1 << 16),
    prefixCachePages:
      o.prefixCachePages === null ? null : int('prefixCachePages', o.prefixCachePages, 0, pages),
    prefixReuse: PREFIX_REUSE_MODES.includes(o.prefixReuse as never)
      ? (o.prefixReuse as PrefixReuseMode)
      : oneOf('prefixReuse', PREFIX_REUSE_MODES, o.prefixReuse),
    chunkTokens: int('chunkTokens', o.chunkTokens, 1, 4096),
    heartbeatMs: int('heartbeatMs', o.heartbeatMs, 50, 60_000),
    parentCheckMs: int('parentCheckMs', o.parentCheckMs, 10, 60_000),
    drainTimeoutMs: int('drainTimeoutMs', o.drainTimeoutMs, 0, 3_600_000),
    allowFaultInjection: bool('allowFaultInjection', o.allowFaultInjection),
    kvDevice: o.kvDevice === null ? null : int('kvDevice', o.kvDevice, 0, 1023),
    model: o.model === null ? null : nonEmpty('model', o.model),
    sequences: int('sequences', o.sequences, 1, 256),
    contextSize: o.contextSize === null ? null : int('contextSize', o.contextSize, 16, 1 << 20),
    threads: int('threads', o.threads, 0, 1024),
    gpu: o.gpu === 'auto' || o.gpu === 'cpu' ? o.gpu : oneOf('gpu', ['auto', 'cpu'], o.gpu),
  };
  return Object.freeze(options);
}

/** Pool pages the prefix cache may hold: `prefixCachePages`, or a quarter of the pool. */
export function prefixCacheBudget(o: Pick<EngineOptions, 'pages' | 'prefixCachePages'>): number {
  return o.prefixCachePages ?? Math.floor(o.pages / 4);
}

/**
 * llama.cpp threads for each of `engines` engines sharing this machine: its threads spin while
 * they wait, so engines on one machine split its cores.
 */
export function threadsPerEngine(engines: number): number {
  return Math.max(1, Math.floor(availableParallelism() / Math.max(1, engines)));
}

/** The `pdctl engine` flags that serve a llama.cpp model (for stacks started by code: tests, benchmarks, drills). */
export function llamaEngineFlags(o: {
  modelPath: string;
  sequences: number;
  contextSize?: number | null;
  threads?: number;
  gpu?: 'auto' | 'cpu';
}): string[] {
  return [
    '--model',
    o.modelPath,
    '--sequences',
    String(o.sequences),
    ...(o.contextSize ? ['--context-size', String(o.contextSize)] : []),
    ...(o.threads ? ['--threads', String(o.threads)] : []),
    ...(o.gpu ? ['--gpu', o.gpu] : []),
  ];
}
