/**
 * The built-in deterministic model.
 *
 * It is not a language model, but it behaves like one where pdctl can tell: prefill
 * writes real KV bytes for every prompt token into the room's pages; every decode step reads the
 * KV of the whole context (so its cost grows with context length, as attention's does) and picks
 * the next word from what it read, so KV that was corrupted in transfer yields different text. Same
 * prompt and settings give the same words, which is how tests and drills check a completion.
 */
import { type Clock, systemClock } from '../ports/clock.ts';
import type {
  Between,
  ChatMessage,
  DecodeStream,
  EngineModel,
  FirstToken,
  KvShape,
  ModelInfo,
  ModelRequest,
  PositionalKv,
  PrefillOptions,
} from './executor.ts';
import { KvImageError } from './executor.ts';
import { WORDS } from './words.ts';

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

  /** Each page as 32-bit words, made once: what a decode step reads at every token. */
  private words: Uint32Array[] | null = null;

  /**
   * Folds every 32-bit word of the KV of positions 0..count-1, in order, into the FNV hash `h` —
   * one pass over the context, as attention reads it — and returns it. (Positions fill their
   * pages end to end: the size of a position divides the page's.)
   */
  attend(count: number, h: number): number {
    if (count < 0 || count > this.capacityTokens)
      throw new RangeError(`KV position ${count - 1} is outside the room's ${this.capacityTokens}`);
    this.words ??= this.pages.map((p) => new Uint32Array(p.buffer, p.byteOffset, p.length >>> 2));
    let left = count * (this.kvBytesPerToken >>> 2);
    for (const words of this.words) {
      const n = Math.min(left, words.length);
      for (let i = 0; i < n; i++) h = Math.imul(h ^ (words[i] as number), FNV_PRIME);
      left -= n;
      if (left === 0) break;
    }
    return h;
  }
}

/** Prompt tokens computed between two returns to the event loop. */
const SLICE_TOKENS = 512;

export interface ModelOptions {
  /** KV bytes written per token; a multiple of 4 that divides the page size. Default 64. */
  kvBytesPerToken: number;
  /** Compute per prompt token in prefill, in microseconds. Default 0. */
  prefillUsPerToken: number;
  /**
   * How prefill's compute time is spent: `spin` keeps this process's CPU busy for it (default);
   * `device` stands in for an accelerator of the engine's own — each slice of prefill holds the
   * engine's one simulated device that long, slices of concurrent rooms queue for it in turn, and
   * the CPU stays free. `device` is what a fleet of separate GPUs looks like on a machine whose
   * few cores every engine shares (bench/trace-replay.ts).
   */
  prefillCompute: Compute;
  /** Compute per decode step, in microseconds (on top of reading the KV). Default 0. */
  decodeUsPerToken: number;
  /**
   * How a decode step's compute time is spent: `spin` (default) keeps this process's CPU — and so
   * the engine's bus loop — busy for it; `device` holds the engine's simulated device for it while
   * the loop stays free, as a GPU's decode step does.
   */
  decodeCompute: Compute;
}

/** Where a simulated compute time is spent: this process's CPU, or a simulated device of its own. */
export const COMPUTE = ['spin', 'device'] as const;
export type Compute = (typeof COMPUTE)[number];

export const DEFAULT_MODEL_OPTIONS: Readonly<ModelOptions> = Object.freeze({
  kvBytesPerToken: 64,
  prefillUsPerToken: 0,
  prefillCompute: 'spin' as Compute,
  decodeUsPerToken: 0,
  decodeCompute: 'spin' as Compute,
});

/** Each word's token id: its index in WORDS (what `decodeStep` writes into the KV). */
const WORD_IDS = new Map(WORDS.map((w, i) => [w, i] as const));

const FNV_OFFSET = 0x811c9dc5;
const FNV_PRIME = 0x01000193;

function hashString(s: string): number {
  let h = FNV_OFFSET;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), FNV_PRIME);
  return h >>> 0;
}

/** xorshift32 step: the stream that fills a position's KV bytes. */
function next32(x: number): number {
  let s = x | 0 || 0x9e3779b9;
  s ^= s << 13;
  s ^= s >>> 17;
  s ^= s << 5;
  return s >>> 0;
}

function lastWord(bytes: Uint8Array): number {
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.length).getUint32(
    bytes.length - 4,
    true,
  );
}

function spin(micros: number): void {
  if (micros <= 0) return;
  const end = process.hrtime.bigint() + BigInt(Math.round(micros * 1000));
  while (process.hrtime.bigint() < end) {
    // Busy work stands in for the model's compute.
  }
}

function nowMicros(): number {
  return Number(process.hrtime.bigint() / 1000n);
}

/** A generated token's text: its word, after a space. */
function textOf(token: number): string {
  return ` ${WORDS[token]}`;
}

/** The prompt the built-in model sees for a chat: one `role: text` line per message. */
export function chatPrompt(messages: readonly ChatMessage[]): string {
  return messages.map((m) => `${m.role}: ${m.content}`).join('\n');
}

/** The built-in model's name (`GET /v1/models`). */
export const DETERMINISTIC_MODEL_NAME = 'pdctl-deterministic-1';

/**
 * Tokens one room of the built-in model may hold, prompt and max_tokens together, unless
 * `--context-size` says otherwise: a request beyond it is refused as OpenAI refuses one
 * (`context_length_exceeded`), not served from however much pool there is.
 */
export const DETERMINISTIC_CONTEXT_SIZE = 32_768;

export class DeterministicModel implements ModelInfo, EngineModel {
  readonly name = DETERMINISTIC_MODEL_NAME;
  /** Engines with another KV size still interoperate through the pages they report. */
  readonly format = null;
  readonly contextSize: number;
  readonly sendsTokens = false;
  readonly samples = false;
  readonly slots = null;
  readonly kv: KvShape;
  readonly kvBytesPerToken: number;
  private readonly options: ModelOptions;
  /** A position's KV is a function of the tokens up to it: a copied prefix is that prefix's KV. */
  /** Each room's step is its own (no batching): see `EngineModel.serialSteps`. */
  readonly serialSteps = true;
  readonly positionalKv: PositionalKv = {
    copy: (from, fromAt, to, toAt, count) => {
      const src = new KvSpan(from, this.kvBytesPerToken);
      const dst = new KvSpan(to, this.kvBytesPerToken);
      for (let i = 0; i < count; i++) dst.at(toAt + i).set(src.at(fromAt + i));
    },
  };

  /**
   * `clock`: where compute time is read and the simulated device waits. Default: the process's
   * (compute timed by hrtime); the simulator's virtual clock makes compute take no time but the
   * device's, so a run's figures follow from its seed.
   */
  constructor(
    options: Partial<ModelOptions> & { contextSize?: number | null } = {},
    private readonly clock: Clock | null = null,
  ) {
    this.options = { ...DEFAULT_MODEL_OPTIONS, ...options };
    this.contextSize = options.contextSize ?? DETERMINISTIC_CONTEXT_SIZE;
    const k = this.options.kvBytesPerToken;
    if (!Number.isInteger(k) || k < 4 || k % 4 !== 0 || k > 1 << 20) {
      throw new Error(`kvBytesPerToken must be a multiple of 4 from 4 to 1048576, got ${k}`);
    }
    for (const key of ['prefillUsPerToken', 'decodeUsPerToken'] as const) {
      const v = this.options[key];
      if (!Number.isFinite(v) || v < 0 || v > 1_000_000) {
        throw new Error(`${key} must be from 0 to 1000000 microseconds, got ${v}`);
      }
    }
    for (const key of ['prefillCompute', 'decodeCompute'] as const) {
      if (!COMPUTE.includes(this.options[key]))
        throw new Error(`${key} must be spin or device, got ${JSON.stringify(this.options[key])}`);
    }
    this.kvBytesPerToken = k;
    this.kv = { baseBytes: 0, bytesPerToken: k, decodeGrows: true };
  }

  /** Words (and punctuation runs) of the prompt, each mapped to a token id. */
  tokenize(prompt: string): number[] {
    const parts = prompt.toLowerCase().match(/[\p{L}\p{N}']+|[^\s\p{L}\p{N}]/gu) ?? [];
    return parts.map((w) => hashString(w) % 65_536);
  }

  chat(messages: readonly ChatMessage[]): { prompt: string; tokens: number[] } {
    const prompt = chatPrompt(messages);
    return { prompt, tokens: this.tokenize(prompt) };
  }

  /** The prompt's tokens, then those of the words generated before a migration. */
  contextTokens(request: ModelRequest): number[] {
    const tokens = this.tokenize(request.prompt);
    for (const word of (request.generated ?? '').split(' ')) {
      if (word === '') continue;
      const id = WORD_IDS.get(word);
      if (id === undefined) throw new Error(`"${word}" is not a word this model generates`);
      tokens.push(id);
    }
    return tokens;
  }

  /** The KV of one position: a function of the token and the KV before it (the context). */
  private writeKv(kv: KvSpan, position: number, token: number, prev: number): number {
    const bytes = kv.at(position);
    const out = new DataView(bytes.buffer, bytes.byteOffset, bytes.length);
    let s = Math.imul(prev ^ (token + 1), FNV_PRIME) ^ position;
    for (let i = 0; i < this.kvBytesPerToken; i += 4) {
      s = next32(s);
      out.setUint32(i, s, true);
    }
    return s;
  }

  /**
   * Writes the KV of `tokens[from..to)` at those positions of `kv` (positions before `from` must
   * already be written). Returns compute microseconds.
   */
  prefillSpan(tokens: readonly number[], kv: KvSpan, from = 0, to = tokens.length): number {
    const start = this.micros();
    let prev = from === 0 ? FNV_OFFSET : lastWord(kv.at(from - 1));
    for (let p = from; p < to; p++) prev = this.writeKv(kv, p, tokens[p] as number, prev);
    if (this.options.prefillCompute === 'spin') spin((to - from) * this.options.prefillUsPerToken);
    return this.micros() - start;
  }

  private micros(): number {
    return this.clock === null ? nowMicros() : Math.round(this.clock.monotonic() * 1000);
  }

  /** When the simulated device (`prefillCompute` or `decodeCompute: 'device'`) is free, in ms of the clock's monotonic time. */
  private deviceFreeAt = 0;

  /** Holds the simulated device for `micros`, after the slices queued for it before. */
  private async onDevice(micros: number): Promise<number> {
    if (micros <= 0) return 0;
    const clock = this.clock ?? systemClock;
    const now = clock.monotonic();
    this.deviceFreeAt = Math.max(now, this.deviceFreeAt) + micros / 1000;
    const wait = this.deviceFreeAt - now;
    await new Promise<void>((r) => clock.setTimeout(r, wait));
    return micros;
  }

  /** The token at `position`, chosen from the KV of positions 0..position-1 ("attention"). */
  private pick(kv: KvSpan, position: number): number {
    const h = kv.attend(position, FNV_OFFSET);
    return ((h ^ (h >>> 15)) >>> 0) % WORDS.length;
  }

  /** Writes the KV of `token` at `position`, after the KV of the positions before it. */
  private place(kv: KvSpan, position: number, token: number): void {
    this.writeKv(kv, position, token, position === 0 ? FNV_OFFSET : lastWord(kv.at(position - 1)));
  }

  /**
   * Generates the token at `position` from the KV of positions 0..position-1, writes that
   * token's KV at `position`, and returns the token, its text and compute microseconds (with
   * `decodeCompute: 'spin'`, the step's compute time spun here too).
   */
  decodeStep(kv: KvSpan, position: number): { token: number; text: string; micros: number } {
    const start = this.micros();
    const token = this.pick(kv, position);
    this.place(kv, position, token);
    if (this.options.decodeCompute === 'spin') spin(this.options.decodeUsPerToken);
    return { token, text: textOf(token), micros: this.micros() - start };
  }

  /**
   * Prefill in slices of 512 tokens, back to the event loop between them; the first `reused`
   * positions' KV is in the pages already. The first token is picked from the KV written, as the
   * first decode step in one process picks it (its KV is the decode engine's to write).
   */
  async prefill(
    tokens: readonly number[],
    pages: readonly Uint8Array[],
    between: Between,
    options: PrefillOptions = {},
  ): Promise<{ bytes: number; micros: number; first: FirstToken } | null> {
    const reused = options.reused ?? 0;
    const span = new KvSpan(pages, this.kvBytesPerToken);
    if (tokens.length > span.capacityTokens) {
      throw new KvImageError(
        `${tokens.length} tokens of KV do not fit the room's ${span.capacityTokens}`,
      );
    }
    if (!Number.isInteger(reused) || reused < 0 || reused > tokens.length)
      throw new RangeError(`reused must be from 0 to ${tokens.length} positions, got ${reused}`);
    let micros = 0;
    for (let from = reused; from < tokens.length; from += SLICE_TOKENS) {
      if (!(await between())) return null;
      const to = Math.min(tokens.length, from + SLICE_TOKENS);
      micros += this.prefillSpan(tokens, span, from, to);
      if (this.options.prefillCompute === 'device')
        micros += await this.onDevice((to - from) * this.options.prefillUsPerToken);
    }
    if (!(await between())) return null;
    const start = this.micros();
    const token = this.pick(span, tokens.length);
    const first = { token, text: textOf(token) };
    micros += this.micros() - start;
    options.first?.(first);
    return { bytes: tokens.length * this.kvBytesPerToken, micros, first };
  }

  /**
   * Decodes in the pages themselves: the first token's KV is written after the context's, and
   * each step reads the whole context and writes its own KV.
   */
  async startDecode(
    context: readonly number[],
    first: FirstToken,
    pages: readonly Uint8Array[],
  ): Promise<DecodeStream> {
    const span = new KvSpan(pages, this.kvBytesPerToken);
    if (!Number.isInteger(first.token) || first.token < 0 || first.token >= WORDS.length)
      throw new KvImageError(`${first.token} is not a token this model generates`);
    this.place(span, context.length, first.token);
    let position = context.length + 1;
    return {
      next: () => {
        const step = this.decodeStep(span, position++);
        if (this.options.decodeCompute === 'spin') return step;
        return this.onDevice(this.options.decodeUsPerToken).then((micros) => ({
          ...step,
          micros: step.micros + micros,
        }));
      },
      close: () => {},
    };
  }

  async close(): Promise<void> {}
}

/**
 * The built-in model run start to finish in this process, with its KV in plain memory: what a
 * completion through the engines must equal.
 */
export function generateInProcess(
  model: DeterministicModel,
  prompt: string,
  maxTokens: number,
): { text: string; promptTokens: number; tokens: number } {
  const tokens = model.tokenize(prompt);
  const kv = new KvSpan(
    [new Uint8Array(Math.max(1, tokens.length + maxTokens) * model.kvBytesPerToken)],
    model.kvBytesPerToken,
  );
  model.prefillSpan(tokens, kv);
  let text = '';
  for (let i = 0; i < maxTokens; i++) text += model.decodeStep(kv, tokens.length + i).text;
  return { text, promptTokens: tokens.length, tokens: maxTokens };
}
