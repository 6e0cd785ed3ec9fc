/**
 * What pdctl needs from a model (docs/design.md §7), in two halves:
 *
 * - `ModelInfo`, for the control plane and the API: the model's name, how a request tokenizes
 *   (prompt sizes, chat template), and its context limit.
 * - `EngineModel`, for the engines: prefill a room's context into a KV image in its pages, and
 *   decode from such an image, token by token.
 *
 * The built-in deterministic model (deterministic.ts) writes its KV position by position into the
 * pages and keeps decoding into them; a llama.cpp model (llama/) saves a sequence's state as one
 * image and decodes in its own context. The engines treat both the same way.
 */

/**
 * Sampling a request asks for, as the OpenAI API defines it. Greedy when temperature is 0 or
 * absent. `topP` absent is 1 and `topK` absent is no limit (not llama.cpp's 0.95 and 40). The
 * token at context position p is drawn with a seed made of `seed` and p, so that a room that
 * continues a migrated one draws what the first would have drawn from there on.
 */
export interface Sampling {
  temperature?: number;
  topP?: number;
  topK?: number;
  seed?: number;
  /** OpenAI's: a token's logit is lowered by this times its count in the recent context. */
  frequencyPenalty?: number;
  /** OpenAI's: a token's logit is lowered by this once it is in the recent context. */
  presencePenalty?: number;
}

/** A chat message, as the API receives it. */
export interface ChatMessage {
  role: string;
  content: string;
}

/** The part of a room's request a model reads. */
export interface ModelRequest {
  prompt: string;
  /** The context's token ids (prompt, then any generated before a migration), for token models. */
  tokens?: readonly number[];
  /** Text generated before a migration (models that tokenize text in the engines). */
  generated?: string;
}

/** How much KV pool a room takes on an engine: `baseBytes + tokens × bytesPerToken`. */
export interface KvShape {
  baseBytes: number;
  bytesPerToken: number;
  /**
   * True when decode writes each new token's KV into the pool (a decode engine reserves pages
   * for prompt + max_tokens); false when only the prompt's image lands there and decode goes on
   * in the model runtime's own memory.
   */
  decodeGrows: boolean;
}

/** Pages a room of `tokens` positions takes in a pool of `pageBytes` pages. */
export function pagesFor(kv: KvShape, pageBytes: number, tokens: number): number {
  return Math.max(1, Math.ceil((kv.baseBytes + tokens * kv.bytesPerToken) / pageBytes));
}

/** The model as the control plane and the API see it. */
export interface ModelInfo {
  /** What `GET /v1/models` lists and `room.created` records. */
  readonly name: string;
  /**
   * What an engine must report in its hello to join (its model file and KV layout): engines of
   * another model, or whose KV images another engine could not load, are refused. Null: any.
   */
  readonly format: string | null;
  /** Most tokens one room may hold, prompt and max_tokens together; null when only pages bound it. */
  readonly contextSize: number | null;
  /** Whether rooms carry token ids to the engines (this tokenizer is the only one that runs). */
  readonly sendsTokens: boolean;
  /** Whether it samples (temperature, top_p, penalties mean something); false: its text is fixed. */
  readonly samples: boolean;
  tokenize(text: string): number[];
  /** A chat's prompt in the model's chat template, with its tokens. */
  chat(messages: readonly ChatMessage[]): { prompt: string; tokens: number[] };
  /** The tokens of a request's context (a migrated one's includes what was generated). */
  contextTokens(request: ModelRequest): number[];
}

/** One generated token. */
export interface DecodeStep {
  token: number;
  text: string;
  /** Compute time of this step. */
  micros: number;
}

/**
 * A room's generation. `next()` gives the next token, or null when the model ended the text (an
 * end-of-generation token); a runtime that computes off this thread returns a promise, and the
 * engine asks every room for its next token before awaiting any (so they batch).
 */
export interface DecodeStream {
  next(): DecodeStep | null | Promise<DecodeStep | null>;
  /** Frees what the stream holds (a sequence); idempotent, safe while a `next()` is pending. */
  close(): void;
}

/**
 * The answer's first token, drawn from the logits of the context's last position at the end of
 * a prefill: its id, and the text it adds (empty while it ends mid-character).
 */
export interface FirstToken {
  token: number;
  text: string;
}

/** What a prefill is asked beyond its tokens. */
export interface PrefillOptions {
  /** Positions whose KV is in the pages already (a cached prefix). Default 0. */
  reused?: number;
  /** How the first token is drawn; absent: greedy. */
  sampling?: Sampling;
  /** Called with the first token as soon as it is drawn (null: the model ended the text at once). */
  first?: (token: FirstToken | null) => void;
}

/** Between two slices of prefill compute: false once the room was stopped (the work ends). */
export type Between = () => Promise<boolean>;

/** What llama.cpp reports of a loaded model's context: sent in the hello, shown by `/v1/engines`. */
export interface ModelRuntime {
  /** Tokens a sequence's context holds (`--context-size`, else the model's training context). */
  contextSize: number;
  /** CPU threads it evaluates with (`--threads`, else its own choice). */
  threads: number;
  /** The GPU backend it runs on (`cuda`, …), or `cpu` (`--gpu cpu`, or none found). */
  gpu: string;
}

/** The model as an engine runs it. */
export interface EngineModel {
  readonly name: string;
  /** See `ModelInfo.format`: sent in the hello. */
  readonly format: string | null;
  readonly kv: KvShape;
  /** Rooms it computes at once (prefill concurrency, decode batch); null when it has no limit. */
  readonly slots: number | null;
  /** Most tokens one room may hold; null when only the KV pages bound it. */
  readonly contextSize: number | null;
  /** What its runtime (llama.cpp) reports it was given; absent for the built-in model. */
  readonly runtime?: ModelRuntime;
  contextTokens(request: ModelRequest): number[];
  /**
   * Computes the KV of `tokens` into `pages` (views of the pool, or host copies of a device
   * pool's); the KV of the first `reused` positions is there already (a cached prefix, copied in
   * with `positionalKv`), and only the rest is computed. The logits of the last position give the
   * answer's first token, drawn with `sampling` as in-process generation draws it (protocol 9):
   * handed to `first` as soon as it is drawn, before the KV is written out, and resolved with the
   * rest. Resolves with the bytes written, the compute time (`saveMicros` of it: writing the KV
   * into the pages, where that is a step of its own, as llama.cpp's state save is) and, for a
   * model that reuses prefixes itself (`heldPrefixes`), the positions it reused; or null when
   * `between` said the room stopped. Throws a KvImageError when the pages cannot hold it.
   */
  prefill(
    tokens: readonly number[],
    pages: readonly Uint8Array[],
    between: Between,
    options?: PrefillOptions,
  ): Promise<{
    bytes: number;
    micros: number;
    saveMicros?: number;
    reused?: number;
    first: FirstToken | null;
  } | null>;
  /**
   * Present where the model runtime keeps what it evaluated and reuses the longest prefix it holds
   * in the next prefill (llama.cpp: a prefill engine's sequences keep their tokens between rooms):
   * the token lists it holds now, which the engine names as blocks for the router's index.
   */
  heldPrefixes?(): number[][];
  /**
   * Present where the model's KV lies in the pool position by position (the built-in model): the
   * KV of a run of positions can be copied from one list of pages to another, which is how a
   * prefill engine keeps blocks of prompts it computed and puts them back (engine/prefix-cache.ts).
   * Absent: the engine keeps no prefix cache in its pool.
   */
  readonly positionalKv?: PositionalKv;
  /**
   * True where the steps of different rooms run one after another, not batched (the built-in
   * model): the decode engine then steps interactive rooms' before batch ones'.
   */
  readonly serialSteps?: boolean;
  /**
   * Starts decoding from the KV of `context` that arrived in `pages`, after the answer's first
   * token (`first`, drawn by the prefill): the stream evaluates it and generates the second on.
   */
  startDecode(
    context: readonly number[],
    first: FirstToken,
    pages: readonly Uint8Array[],
    sampling: Sampling,
  ): Promise<DecodeStream>;
  close(): Promise<void>;
}

/** Copies the KV of positions between page lists (see `EngineModel.positionalKv`). */
export interface PositionalKv {
  /** Copies positions `[fromAt, fromAt + count)` of `from` to `[toAt, toAt + count)` of `to`. */
  copy(
    from: readonly Uint8Array[],
    fromAt: number,
    to: readonly Uint8Array[],
    toAt: number,
    count: number,
  ): void;
}

/** KV that does not fit the room's pages, or an image that is not one (a bug, or bad memory). */
export class KvImageError extends Error {
  override name = 'KvImageError';
}
