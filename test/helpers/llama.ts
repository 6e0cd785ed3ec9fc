/**
 * The tiny generated GGUF model for llama.cpp tests: written once per test file, with the flags
 * every engine of a llama stack gets, and the model in this process (the reference a completion
 * through the engines must equal).
 */
import { join } from 'node:path';
import { llamaEngineFlags } from '../../src/engine/options.ts';
import { LlamaEngineModel } from '../../src/model/llama/engine-model.ts';
import { LlamaModelInfo } from '../../src/model/llama/model-info.ts';
import { writeTinyModel } from '../../src/model/tiny-gguf.ts';
import { WORDS } from '../../src/model/words.ts';
import { tempDir } from './tmp.ts';

export interface TinyLlama {
  path: string;
  /** `pdctl engine` / `pdctl serve` flags for it. */
  args: string[];
  info: LlamaModelInfo;
  /** The same model in this process. */
  reference: LlamaEngineModel;
  close(): Promise<void>;
}

export const SEQUENCES = 4;
export const CONTEXT = 1024;

/** `auto` on a GPU host (`npm run gpu-check`): the engines and the reference on node-llama-cpp's CUDA build. */
export const GPU = process.env.PDCTL_LLAMA_GPU === 'auto' ? 'auto' : 'cpu';

export async function tinyLlama(): Promise<TinyLlama> {
  const path = join(tempDir('pdctl-llama-'), 'tiny.gguf');
  writeTinyModel(path);
  const shape = { modelPath: path, sequences: SEQUENCES, contextSize: CONTEXT, gpu: GPU } as const;
  const info = await LlamaModelInfo.open(shape);
  // One thread everywhere: llama.cpp's threads spin while they wait, and a 2-core machine runs
  // the engines and this process at once.
  const reference = await LlamaEngineModel.open({ ...shape, threads: 1 });
  return {
    path,
    args: llamaEngineFlags({ ...shape, threads: 1 }),
    info,
    reference,
    close: async () => {
      await reference.close();
      await info.close();
    },
  };
}

/** A prompt of `words` words of the model's vocabulary, different for each `i`. */
export function llamaPrompt(i: number, words: number): string {
  return Array.from(
    { length: words },
    (_, k) => WORDS[(i * 31 + k * 7 + (k >> 3)) % WORDS.length],
  ).join(' ');
}
