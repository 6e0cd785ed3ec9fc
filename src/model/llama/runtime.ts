/**
 * Loading llama.cpp (node-llama-cpp's prebuilt binaries) and a GGUF model file, once per process.
 * `gpu: 'auto'` takes the CUDA build where a GPU and its driver are present and the CPU build
 * otherwise; `'cpu'` never looks for a GPU (tests, CI, and a host whose GPU is for something else).
 */
import { statSync } from 'node:fs';
import { basename } from 'node:path';
import type { Llama } from 'node-llama-cpp';

export type LlamaGpu = 'auto' | 'cpu';

const runtimes = new Map<LlamaGpu, Promise<Llama>>();

/** The llama.cpp runtime of this process (one per GPU setting). */
export function llamaRuntime(gpu: LlamaGpu): Promise<Llama> {
  let r = runtimes.get(gpu);
  if (!r) {
    r = import('node-llama-cpp').then(({ getLlama, LlamaLogLevel }) =>
      getLlama({
        gpu: gpu === 'cpu' ? false : 'auto',
        // The prebuilt binaries only: never compile llama.cpp on a serving host.
        build: 'never',
        logLevel: LlamaLogLevel.error,
      }),
    );
    runtimes.set(gpu, r);
  }
  return r;
}

/** Checks that `path` is a readable GGUF file; its size in bytes. Throws a message that says what to do. */
export function checkModelFile(path: string): number {
  let size: number;
  try {
    const st = statSync(path);
    if (!st.isFile()) throw new Error(`${path} is not a file`);
    size = st.size;
  } catch (err) {
    throw new Error(
      `cannot read the model file ${path}: ${(err as Error).message}; give --model the path of a .gguf file (\`npm run model:tiny\` writes a tiny one to try)`,
    );
  }
  return size;
}

/**
 * The identity engines of one stack must share (`ModelInfo.format`): the model file (name and
 * size) and the sequence count, which fixes the layout of a saved state (llama.cpp refuses a
 * state saved with another number of sequences).
 */
export function llamaFormat(path: string, sequences: number): string {
  return `llama.cpp ${basename(path)} (${checkModelFile(path)} bytes) × ${sequences} sequences`;
}
