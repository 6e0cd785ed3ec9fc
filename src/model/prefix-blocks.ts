/**
 * Prefix blocks (issue 30, first step): a prompt's tokens cut into blocks of a fixed number of
 * tokens, each named by a hash chained over the blocks before it, so that a block's name means
 * "this exact prefix, up to the end of this block" — two prompts share a block name exactly when
 * they share every token up to there. A trailing partial block has no name (its KV cannot be
 * reused by a longer prompt that differs after it). Engines will key their prefix cache by these
 * names and the router its index; both compute them the same way, from the token ids.
 */
import { createHash } from 'node:crypto';

/** Bytes of a block name: 16 (128 bits) makes a collision across a fleet's blocks negligible. */
const NAME_BYTES = 16;

/** The names of the full blocks of `tokens`, in order (a prompt of 10 tokens in blocks of 4: two). */
export function blockNames(tokens: readonly number[], blockTokens: number): string[] {
  if (!Number.isInteger(blockTokens) || blockTokens < 1)
    throw new RangeError(`blockTokens must be a positive integer, got ${blockTokens}`);
  const names: string[] = [];
  let previous = '';
  const full = Math.floor(tokens.length / blockTokens);
  const ids = new Uint32Array(blockTokens);
  for (let b = 0; b < full; b++) {
    for (let i = 0; i < blockTokens; i++) {
      const t = tokens[b * blockTokens + i] as number;
      if (!Number.isInteger(t) || t < 0 || t > 0xffff_ffff)
        throw new RangeError(`token ${b * blockTokens + i} is not a token id: ${t}`);
      ids[i] = t;
    }
    previous = createHash('sha256')
      .update(previous)
      .update(new Uint8Array(ids.buffer))
      .digest('hex')
      .slice(0, NAME_BYTES * 2);
    names.push(previous);
  }
  return names;
}

/** How many leading blocks two lists of block names share (the reusable prefix, in blocks). */
export function sharedBlocks(a: readonly string[], b: readonly string[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/**
 * Whether a model runtime that keeps prefixes itself (llama.cpp's sequences) reuses them: `auto`
 * where continuing a held prefix measures cheaper than computing it again, `on`, or `off`.
 */
export const PREFIX_REUSE_MODES = ['auto', 'on', 'off'] as const;
export type PrefixReuseMode = (typeof PREFIX_REUSE_MODES)[number];
