/** `--model` for the commands that start a stack (`serve`, `run`): the control plane's side of it. */
import { resolve as resolvePath } from 'node:path';
import { threadsPerEngine } from '../engine/options.ts';
import { UsageError } from '../errors.ts';
import type { Logger } from '../log.ts';
import { DeterministicModel } from '../model/deterministic.ts';
import type { ModelInfo } from '../model/executor.ts';

/**
 * The model as the control plane sees it: with --model, the GGUF's tokenizer, chat template and
 * context; without, the built-in model with `--context-size` when given.
 */
export async function openModelInfo(o: Record<string, unknown>, log: Logger): Promise<ModelInfo> {
  if (o.model === undefined)
    return new DeterministicModel({ contextSize: (o.contextSize as number | undefined) ?? null });
  try {
    // Loaded only with --model: node-llama-cpp takes half a second to import.
    const { LlamaModelInfo } = await import('../model/llama/model-info.ts');
    const info = await LlamaModelInfo.open({
      modelPath: resolvePath(o.model as string),
      sequences: o.sequences as number,
      contextSize: (o.contextSize as number | undefined) ?? null,
      // The control plane loads the vocabulary only: no GPU needed.
      gpu: 'cpu',
    });
    log.info({ model: info.format, contextSize: info.contextSize }, 'serving a llama.cpp model');
    return info;
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** The engine flags with `--threads` filled in for a llama.cpp model (see `threadsPerEngine`). */
export function withThreads(o: Record<string, unknown>, engines: number): Record<string, unknown> {
  if (o.model === undefined || o.threads !== undefined) return o;
  return { ...o, threads: threadsPerEngine(engines) };
}
