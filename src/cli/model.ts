/** `--model` for the commands that start a stack (`serve`, `run`): the control plane's side of it. */
import { resolve as resolvePath } from 'node:path';
import { threadsPerEngine } from '../engine/options.ts';
import { UsageError } from '../errors.ts';
import type { Logger } from '../log.ts';
import type { LlamaModelInfo } from '../model/llama/model-info.ts';

/** With --model: the model's tokenizer, chat template and context for the control plane. */
export async function openModelInfo(
  o: Record<string, unknown>,
  log: Logger,
): Promise<LlamaModelInfo | null> {
  if (o.model === undefined) return null;
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
