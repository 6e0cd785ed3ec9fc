/**
 * What an engine needs from a model (docs/design.md §7): tokenize, prefill KV into a
 * room's pages, and decode one token at a time from them. The built-in deterministic model
 * (deterministic.ts) is one implementation; an inference runtime is another.
 */

/** KV storage for one room: positions laid out back to back across the room's pages. */
export class KvSpan {
  readonly capacityTokens: number;

  constructor(
    readonly pages: readonly Uint8Array[],
    readonly kvBytesPerToken: number,
  ) {
    const pageBytes = pages[0]?.length ?? 0;
    if (pages.some((p) => p.length !== pageBytes)) throw new Error('KV pages differ in size');
    this.capacityTokens = Math.floor((pageBytes * pages.length) / kvBytesPerToken);
  }

  /** The KV bytes of one position, as a view (positions never straddle pages). */
  at(position: number): Uint8Array {
    const perPage = Math.floor((this.pages[0] as Uint8Array).length / this.kvBytesPerToken);
    const page = this.pages[Math.floor(position / perPage)];
    if (!page || position < 0 || position >= this.capacityTokens) {
      throw new RangeError(`KV position ${position} is outside the room's ${this.capacityTokens}`);
    }
    const offset = (position % perPage) * this.kvBytesPerToken;
    return page.subarray(offset, offset + this.kvBytesPerToken);
  }
}

/** A model as the engines and the control plane use it; each implementation wraps one runtime. */
export interface ModelExecutor {
  readonly name: string;
  readonly kvBytesPerToken: number;
  tokenize(prompt: string): number[];
  /**
   * The context of a migrated request: the prompt's tokens followed by those of `generated`, text
   * this model produced from it. Prefilling it and decoding on continues the undisturbed output.
   */
  contextTokens(prompt: string, generated: string): number[];
  /**
   * Writes the KV of `tokens[from..to)` at those positions of `kv` (positions before `from` must
   * already be written: callers prefill in slices to stay responsive). Returns compute microseconds.
   */
  prefill(tokens: readonly number[], kv: KvSpan, from?: number, to?: number): number;
  /**
   * Generates the token at `position` from the KV of positions 0..position-1, writes that
   * token's KV at `position`, and returns the token, its text and compute microseconds.
   */
  decodeStep(kv: KvSpan, position: number): { token: number; text: string; micros: number };
}

/**
 * The same model run in this process, start to finish, with its KV in plain memory: what a
 * completion through the engines must equal.
 */
export function generateInProcess(
  model: ModelExecutor,
  prompt: string,
  maxTokens: number,
): { text: string; promptTokens: number; tokens: number } {
  const tokens = model.tokenize(prompt);
  const total = tokens.length + maxTokens;
  const kv = new KvSpan(
    [new Uint8Array(Math.max(1, total) * model.kvBytesPerToken)],
    model.kvBytesPerToken,
  );
  model.prefill(tokens, kv);
  let text = '';
  for (let i = 0; i < maxTokens; i++) text += model.decodeStep(kv, tokens.length + i).text;
  return { text, promptTokens: tokens.length, tokens: maxTokens };
}
