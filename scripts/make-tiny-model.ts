/**
 * Writes the tiny generated llama model (src/model/tiny-gguf.ts) to a file:
 *   npm run model:tiny -- [--out data/tiny.gguf] [--seed N]
 * Random weights, a real llama.cpp model: for trying the llama.cpp path where no model can be
 * downloaded. Its text means nothing.
 */
import { mkdirSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { writeTinyModel } from '../src/model/tiny-gguf.ts';

const { values } = parseArgs({
  options: {
    out: { type: 'string', default: 'data/tiny.gguf' },
    seed: { type: 'string', default: '1' },
    help: { type: 'boolean', short: 'h' },
  },
});
if (values.help) {
  process.stdout.write('usage: npm run model:tiny -- [--out data/tiny.gguf] [--seed N]\n');
  process.exit(0);
}
const seed = Number(values.seed);
if (!Number.isInteger(seed) || seed < 1 || seed > 2 ** 32 - 1) {
  process.stderr.write(
    `--seed must be an integer from 1 to ${2 ** 32 - 1}, got "${values.seed}"\n`,
  );
  process.exit(2);
}
const out = resolve(values.out as string);
mkdirSync(dirname(out), { recursive: true });
const bytes = writeTinyModel(out, { seed });
process.stdout.write(`wrote ${out} (${bytes} bytes, seed ${seed})\n`);
