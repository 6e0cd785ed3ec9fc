/** Parsers for numeric CLI flags, shared by every command: one wording for every bad value. */
import { resolve } from 'node:path';
import { type Command, Option } from 'commander';
import { KV_SEND_CHOICES } from '../bus/protocol.ts';
import { ENGINE_DEFAULTS } from '../engine/options.ts';
import { UsageError } from '../errors.ts';
import { COMPUTE } from '../model/deterministic.ts';
import { PREFIX_REUSE_MODES } from '../model/prefix-blocks.ts';
import { backends } from '../transfer/pool.ts';

/** A commander argParser for an integer flag of at least `min` (default 0). */
export function intArg(name: string, min = 0): (v: string) => number {
  const what =
    min === 0 ? 'a non-negative integer' : min === 1 ? 'a positive integer' : `an integer ≥ ${min}`;
  return (v: string): number => {
    if (!/^\d+$/.test(v) || Number(v) < min)
      throw new UsageError(`${name} must be ${what}, got "${v}"`);
    return Number(v);
  };
}

/** The KV pool and model flags of an engine: on `pdctl engine`, and on `pdctl serve` for the engines it spawns. */
export function engineShapeOptions(c: Command, per = ''): Command {
  return c
    .option(
      '--model <path.gguf>',
      'serve this GGUF model with llama.cpp (any llama.cpp model file; `npm run model:tiny` writes a tiny one) instead of the built-in deterministic model',
    )
    .option(
      '--sequences <n>',
      `with --model: rooms each engine computes at once (llama.cpp sequences); every engine of a stack needs the same`,
      intArg('--sequences', 1),
      ENGINE_DEFAULTS.sequences,
    )
    .option(
      '--context-size <n>',
      "tokens one room may hold, prompt and max_tokens together; a request beyond it is refused with context_length_exceeded (default: with --model the model's training context, at most 4096; the built-in model 32768)",
      intArg('--context-size', 16),
    )
    .option(
      '--threads <n>',
      "with --model: llama.cpp CPU threads per engine (default: the machine's cores; `pdctl serve` splits them among its engines)",
      intArg('--threads', 1),
    )
    .addOption(
      new Option(
        '--gpu <mode>',
        'with --model: auto uses a GPU where there is one (CUDA build); cpu never does',
      )
        .choices(['auto', 'cpu'])
        .default(ENGINE_DEFAULTS.gpu),
    )
    .option(
      '--pages <n>',
      `KV pool pages${per} (default ${ENGINE_DEFAULTS.pages}; with --model, at least two full contexts per sequence)`,
      intArg('--pages', 1),
    )
    .option(
      '--page-bytes <n>',
      'bytes per KV page (multiple of 64)',
      intArg('--page-bytes', 64),
      ENGINE_DEFAULTS.pageBytes,
    )
    .option(
      '--kv-bytes-per-token <n>',
      'model: KV bytes per token',
      intArg('--kv-bytes-per-token', 4),
      ENGINE_DEFAULTS.kvBytesPerToken,
    )
    .option(
      '--prefill-us-per-token <n>',
      'model: prefill compute per prompt token (µs)',
      intArg('--prefill-us-per-token'),
      ENGINE_DEFAULTS.prefillUsPerToken,
    )
    .addOption(
      new Option(
        '--prefill-compute <how>',
        "model: how the prefill compute time is spent: spin keeps this CPU busy; device stands in for a GPU of the engine's own (prefill waits for it, one slice at a time, and the CPU stays free)",
      )
        .choices([...COMPUTE])
        .default(ENGINE_DEFAULTS.prefillCompute),
    )
    .option(
      '--decode-us-per-token <n>',
      'model: compute per decode step (µs)',
      intArg('--decode-us-per-token'),
      ENGINE_DEFAULTS.decodeUsPerToken,
    )
    .addOption(
      new Option(
        '--decode-compute <how>',
        "model: how each decode step's compute time is spent: spin keeps this CPU, and so the engine's bus loop, busy; device stands in for a GPU of the engine's own (the step waits for it, and the loop stays free)",
      )
        .choices([...COMPUTE])
        .default(ENGINE_DEFAULTS.decodeCompute),
    )
    .option(
      '--kv-device <n>',
      'KV pool pages in the memory of CUDA device <n>, moved GPU to GPU (default: host shared memory)',
      intArg('--kv-device'),
    )
    .option(
      '--kv-block-tokens <n>',
      `tokens per prefix block: the unit prefill engines cache and the router counts; the control plane and every engine need the same`,
      intArg('--kv-block-tokens', 1),
      ENGINE_DEFAULTS.kvBlockTokens,
    )
    .option(
      '--prefix-cache-pages <n>',
      `KV pool pages${per} a prefill engine keeps computed prompt blocks in, for rooms whose prompt starts the same (default: a quarter of the pool; 0: none; rooms take the pages back when they need them). With --model, the sequences keep prompts instead, and 0 turns that off too (docs/model.md)`,
      intArg('--prefix-cache-pages'),
    )
    .addOption(
      new Option(
        '--prefix-reuse <when>',
        "with --model: whether a prefill engine's sequences keep prompts for the next prompt that starts the same to continue from. auto: only where the model's check at start finds continuing cheaper than computing again (llama.cpp's flash attention on a CPU is not: docs/model.md); on; off",
      )
        .choices([...PREFIX_REUSE_MODES])
        .default(ENGINE_DEFAULTS.prefixReuse),
    )
    .addOption(
      new Option(
        '--kv-transport <mode>',
        'how KV reaches another engine: shm (shared memory, one host), ucx (UCX, any host), auto (shared memory on this host, UCX to others where UCX is installed). Default: auto for pdctl engine; shm for the engines pdctl serve spawns, which are all on its host',
      ).choices(KV_SEND_CHOICES),
    );
}

/** The same flags, as `pdctl engine` arguments. */
export function engineShapeArgs(o: Record<string, unknown>): string[] {
  const given = (flag: string, v: unknown) => (v === undefined ? [] : [flag, String(v)]);
  return [
    ...given('--model', o.model === undefined ? undefined : resolve(o.model as string)),
    ...given('--sequences', o.sequences),
    ...given('--context-size', o.contextSize),
    ...given('--threads', o.threads),
    ...given('--gpu', o.gpu),
    ...given('--pages', o.pages),
    '--page-bytes',
    String(o.pageBytes),
    '--kv-bytes-per-token',
    String(o.kvBytesPerToken),
    '--prefill-us-per-token',
    String(o.prefillUsPerToken),
    '--decode-us-per-token',
    String(o.decodeUsPerToken),
    ...given('--prefill-compute', o.prefillCompute),
    ...given('--decode-compute', o.decodeCompute),
    ...(o.kvDevice === undefined ? [] : ['--kv-device', String(o.kvDevice)]),
    ...given('--kv-transport', o.kvTransport),
    ...given('--kv-block-tokens', o.kvBlockTokens),
    ...given('--prefix-cache-pages', o.prefixCachePages),
    ...given('--prefix-reuse', o.prefixReuse),
  ];
}

/** `--kv-device N` needs CUDA and that device here; fails before the engine (or any engine serve starts) does, saying why. */
export function checkKvDevice(device: number): void {
  const { cuda } = backends();
  if (!cuda.available) {
    throw new UsageError(
      `--kv-device ${device}: CUDA is not available here (${cuda.reason}); leave out --kv-device to keep KV pages in host shared memory`,
    );
  }
  if (device >= cuda.devices) {
    throw new UsageError(
      `--kv-device ${device}: there is no such device (${cuda.reason}); devices are numbered from 0`,
    );
  }
}
