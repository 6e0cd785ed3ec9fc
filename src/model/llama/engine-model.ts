/**
 * A llama.cpp model as an engine runs it. One context with `sequences` sequences: each room in
 * prefill or decode holds one. Prefill evaluates the context's tokens but the last, saves the
 * sequence's state (its KV cache) and writes it into the room's pages as a KV image; the transfer
 * core moves the pages; decode loads the image into a sequence of its own context, evaluates the
 * last token and generates on, every room's next token asked for at once (llama.cpp batches them).
 *
 * Where prefix reuse is on (`prefixReuse`), a sequence keeps what a prefill evaluated when it is
 * given back, and the next prefill takes the free sequence holding the longest prefix of its
 * tokens (at least `minReuseTokens`), erases the rest and evaluates only what follows
 * (`heldPrefixes` tells the engine what the sequences hold, for the router's index). A prefill that
 * finds no such prefix starts on an empty sequence. `auto` turns reuse on only where the runtime
 * continues a sequence cheaper than it computes the whole prompt again: llama.cpp's flash attention
 * on a CPU does not (docs/model.md, "Prefix reuse").
 */
import { closeSync, mkdirSync, openSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { basename, join } from 'node:path';
import type {
  LlamaContext,
  LlamaContextSequence,
  LlamaModel,
  SequenceEvaluateOptions,
  Token,
} from 'node-llama-cpp';
import { isAlive } from '../../pids.ts';
import {
  type Between,
  type DecodeStream,
  type EngineModel,
  type FirstToken,
  KvImageError,
  type KvShape,
  type ModelRequest,
  type ModelRuntime,
  type PrefillOptions,
  type Sampling,
} from '../executor.ts';
import type { PrefixReuseMode } from '../prefix-blocks.ts';
import {
  KV_IMAGE_HEADER_BYTES,
  kvImageViews,
  writeKvImageFromFile,
  writeViews,
} from './kv-image.ts';
import { type LlamaModelOptions, roomContextSize } from './model-info.ts';
import { llamaFormat, llamaRuntime } from './runtime.ts';
import { TextStream } from './text.ts';

export interface LlamaEngineOptions extends LlamaModelOptions {
  /** CPU threads of the context; 0: llama.cpp's default (all cores). */
  threads: number;
  /**
   * Whether sequences keep what a prefill evaluated for the next to reuse: `on`, `off` (the
   * default), or `auto`: on only where `continuationCheck` at open finds continuing pays.
   */
  prefixReuse?: PrefixReuseMode;
  /** The shortest held prefix worth continuing from (a prefix block); default 1. */
  minReuseTokens?: number;
}

/**
 * What `auto` measured at open: the time to evaluate `CHECK_TOKENS` tokens on an empty sequence,
 * and to evaluate the last `CHECK_CONTINUED` of them on a sequence holding the rest. Continuing
 * pays when it costs less than half of computing them all.
 */
export interface ContinuationCheck {
  coldMs: number;
  continueMs: number;
  pays: boolean;
}

const CHECK_TOKENS = 128;
const CHECK_CONTINUED = 32;

/** Prompt tokens evaluated between two checks that the room still runs. */
const SLICE_TOKENS = 256;

/** Where saved states pass through on their way to and from the pages (memory-backed if it can). */
function stateDir(): string {
  const base = (() => {
    try {
      readdirSync('/dev/shm');
      return '/dev/shm';
    } catch {
      return process.env.TMPDIR ?? '/tmp';
    }
  })();
  // A killed engine's directory is removed by the next one to start.
  for (const name of readdirSync(base)) {
    const m = /^pdctl-kvstate-(\d+)$/.exec(name);
    if (m && Number(m[1]) !== process.pid && !isAlive(Number(m[1]))) {
      rmSync(join(base, name), { recursive: true, force: true });
    }
  }
  const dir = join(base, `pdctl-kvstate-${process.pid}`);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return dir;
}

function nowMicros(): number {
  return Number(process.hrtime.bigint() / 1000n);
}

/** Recent context tokens the penalties count (llama.cpp's default window). */
const PENALTY_WINDOW = 64;

/**
 * node-llama-cpp's options to draw the token at context position `position` after `context`:
 * OpenAI's defaults (top_p 1, no top_k: node-llama-cpp would apply 0.95 and 40), no repeat
 * penalty but the frequency and presence penalties asked for, and a seed of its own for the
 * position, made of the request's seed — the same token at the same place, whichever room draws it.
 */
export function sampleOptions(s: Sampling, context: readonly number[]): SequenceEvaluateOptions {
  const penalize = (s.frequencyPenalty ?? 0) !== 0 || (s.presencePenalty ?? 0) !== 0;
  return {
    temperature: s.temperature ?? 0,
    topP: s.topP ?? 1,
    topK: s.topK ?? 0,
    seed: positionSeed(s.seed ?? 0, context.length),
    ...(penalize
      ? {
          repeatPenalty: {
            punishTokens: context.slice(-PENALTY_WINDOW) as Token[],
            maxPunishTokens: PENALTY_WINDOW,
            penalty: 1,
            frequencyPenalty: s.frequencyPenalty ?? 0,
            presencePenalty: s.presencePenalty ?? 0,
          },
        }
      : {}),
  };
}

/**
 * Whether every token is the model's most likely one as it is: temperature 0 and no penalty. Then
 * one evaluation generates them all; otherwise each is drawn with its own options (`sampled`) —
 * at temperature 0 too, since OpenAI's penalties lower the logits before any choice, greedy or not
 * (node-llama-cpp runs its penalty sampler before the greedy one).
 */
export function greedyUnpenalized(s: Sampling): boolean {
  return (
    (s.temperature ?? 0) === 0 && (s.frequencyPenalty ?? 0) === 0 && (s.presencePenalty ?? 0) === 0
  );
}

/** A 31-bit seed for one position of one request (splitmix32 of the two). */
export function positionSeed(seed: number, position: number): number {
  let z = (Math.imul(seed | 0, 0x9e3779b1) + Math.imul(position | 0, 0x85ebca6b)) | 0;
  z = Math.imul(z ^ (z >>> 16), 0x21f0aaad);
  z = Math.imul(z ^ (z >>> 15), 0x735a2d97);
  return (z ^ (z >>> 15)) >>> 1;
}

export class LlamaEngineModel implements EngineModel {
  readonly name: string;
  readonly format: string;
  readonly slots: number;
  readonly contextSize: number;
  readonly runtime: ModelRuntime;
  private readonly free: LlamaContextSequence[];
  /** Every sequence of the context, free or not. */
  private readonly all: readonly LlamaContextSequence[];
  /** Sequences keep what prefills evaluated (prefix reuse is on). */
  private readonly keepPrefixes: boolean;
  private readonly minReuseTokens: number;
  /** When each sequence was last given back, for choosing which to overwrite. */
  private readonly usedAt = new Map<LlamaContextSequence, number>();
  private uses = 0;
  /**
   * Present where prefix reuse is on: the token lists the sequences hold, which the engine names
   * as blocks for the router's index.
   */
  readonly heldPrefixes?: () => number[][];
  private readonly waiting: Array<(s: LlamaContextSequence) => void> = [];
  /** Streams being closed: the context is disposed only once they are. */
  private readonly closing = new Set<Promise<unknown>>();
  private files = 0;

  private constructor(
    private readonly model: LlamaModel,
    private readonly context: LlamaContext,
    readonly kv: KvShape,
    private readonly dir: string,
    o: LlamaEngineOptions,
    sequences: LlamaContextSequence[],
    /** What `auto` measured at open; null: not measured (`on` or `off`). */
    readonly continuation: ContinuationCheck | null,
  ) {
    this.name = basename(o.modelPath);
    this.format = llamaFormat(o.modelPath, o.sequences);
    this.slots = o.sequences;
    this.contextSize = context.contextSize;
    const gpu = context.model.llama.gpu;
    this.runtime = {
      contextSize: context.contextSize,
      threads: context.idealThreads,
      gpu: gpu || 'cpu',
    };
    this.free = [...sequences];
    this.all = sequences;
    this.keepPrefixes =
      o.prefixReuse === 'on' || (o.prefixReuse === 'auto' && continuation?.pays === true);
    this.minReuseTokens = Math.max(1, o.minReuseTokens ?? 1);
    if (this.keepPrefixes) this.heldPrefixes = () => this.all.map((s) => [...s.contextTokens]);
  }

  static async open(o: LlamaEngineOptions): Promise<LlamaEngineModel> {
    llamaFormat(o.modelPath, o.sequences);
    const llama = await llamaRuntime(o.gpu);
    const model = await llama.loadModel({ modelPath: o.modelPath });
    const contextSize = roomContextSize(o.contextSize, model.trainContextSize);
    const context = await model.createContext({
      contextSize,
      sequences: o.sequences,
      ...(o.threads > 0 ? { threads: o.threads } : {}),
    });
    const sequences = Array.from({ length: o.sequences }, () => context.getSequence());
    const dir = stateDir();
    const first = sequences[0] as LlamaContextSequence;
    const kv = await calibrate(model, first, dir);
    const check = o.prefixReuse === 'auto' ? await continuationCheck(model, first) : null;
    return new LlamaEngineModel(model, context, kv, dir, o, sequences, check);
  }

  contextTokens(request: ModelRequest): number[] {
    if (!request.tokens || request.tokens.length === 0) {
      throw new Error('the request carries no token ids (a control plane without --model?)');
    }
    return [...request.tokens];
  }

  private acquire(): Promise<LlamaContextSequence> {
    const s = this.free.pop();
    if (s) return Promise.resolve(s);
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  /**
   * A sequence for a prefill of `tokens`, and how many of them it holds: the free sequence holding
   * the longest prefix of at least `minReuseTokens`; else the one given back longest ago (the
   * prefill empties it). Free sequences hold prompts only where reuse is on; a sequence waited for
   * when none is free counts as holding nothing.
   */
  private async acquireFor(
    tokens: readonly number[],
  ): Promise<{ seq: LlamaContextSequence; held: number }> {
    let pick: { seq: LlamaContextSequence; held: number } | null = null;
    if (this.keepPrefixes) {
      for (const seq of this.free) {
        const held = this.common(seq, tokens);
        if (held >= this.minReuseTokens && held > (pick?.held ?? 0)) pick = { seq, held };
      }
    }
    if (!pick) {
      const oldest = [...this.free].sort(
        (a, b) => (this.usedAt.get(a) ?? 0) - (this.usedAt.get(b) ?? 0),
      )[0];
      if (oldest) pick = { seq: oldest, held: 0 };
    }
    if (!pick) return { seq: await this.acquire(), held: 0 };
    this.free.splice(this.free.indexOf(pick.seq), 1);
    return pick;
  }

  private common(seq: LlamaContextSequence, tokens: readonly number[]): number {
    const held = seq.contextTokens;
    const n = Math.min(held.length, tokens.length);
    let i = 0;
    while (i < n && held[i] === tokens[i]) i++;
    return i;
  }

  /** Gives a sequence back; `keep`: with what it evaluated (a prefill's), for the next to reuse. */
  private async giveBack(s: LlamaContextSequence, keep = false): Promise<void> {
    if (!keep || !this.keepPrefixes) await s.clearHistory();
    this.usedAt.set(s, ++this.uses);
    const next = this.waiting.shift();
    if (next) next(s);
    else this.free.push(s);
  }

  private stateFile(): string {
    return join(this.dir, `${++this.files}.state`);
  }

  async prefill(
    tokens: readonly number[],
    pages: readonly Uint8Array[],
    between: Between,
    options: PrefillOptions = {},
  ): Promise<{
    bytes: number;
    micros: number;
    saveMicros: number;
    reused: number;
    first: FirstToken | null;
  } | null> {
    if (tokens.length === 0) throw new KvImageError('a prefill needs at least one token');
    const { seq, held } = await this.acquireFor(tokens);
    let kept = false;
    try {
      let micros = 0;
      // The last token is always evaluated: its logits draw the first token.
      const reused = Math.min(held, tokens.length - 1);
      // What it holds past the prefix is erased; a sequence with no prefix worth continuing from
      // is emptied whole: continuing from even one held token costs as much as any continuation.
      if (reused === 0 && seq.nextTokenIndex > 0) await seq.clearHistory();
      else if (seq.nextTokenIndex > reused)
        await seq.eraseContextTokenRanges([{ start: reused, end: seq.nextTokenIndex }]);
      let first: FirstToken | null = null;
      for (let from = reused; from < tokens.length; from += SLICE_TOKENS) {
        if (!(await between())) return null;
        const slice = tokens.slice(from, from + SLICE_TOKENS) as Token[];
        const t0 = nowMicros();
        if (from + slice.length < tokens.length)
          await seq.evaluateWithoutGeneratingNewTokens(slice);
        else first = await this.draw(seq, slice, tokens, options.sampling ?? {});
        micros += nowMicros() - t0;
      }
      options.first?.(first);
      if (!(await between())) return null;
      const t0 = nowMicros();
      const file = this.stateFile();
      try {
        await seq.saveStateToFile(file);
        const bytes = writeKvImageFromFile(pages, file);
        kept = true;
        const saveMicros = nowMicros() - t0;
        return { bytes, micros: micros + saveMicros, saveMicros, reused, first };
      } finally {
        rmSync(file, { force: true });
      }
    } finally {
      // A prefill that did not finish leaves its sequence with tokens it may not hold whole.
      await this.giveBack(seq, kept);
    }
  }

  /**
   * Evaluates `input`, the end of `context`, and draws the token after it as in-process
   * generation draws its first (`stream`): greedy, or with the position's seed and penalties.
   * Null: the model ends the text there.
   */
  private async draw(
    seq: LlamaContextSequence,
    input: readonly Token[],
    context: readonly number[],
    sampling: Sampling,
  ): Promise<FirstToken | null> {
    const last = input.length - 1;
    const options: SequenceEvaluateOptions = greedyUnpenalized(sampling)
      ? { temperature: 0 }
      : sampleOptions(sampling, context);
    const out = await seq.controlledEvaluate([
      ...input.slice(0, last),
      [input[last] as Token, { generateNext: { token: true, options } }],
    ]);
    const token = out[last]?.next?.token;
    if (token === undefined || token === null || this.model.isEogToken(token)) return null;
    return { token, text: new TextStream(this.model, context).push(token) };
  }

  async startDecode(
    context: readonly number[],
    first: FirstToken,
    pages: readonly Uint8Array[],
    sampling: Sampling,
  ): Promise<DecodeStream> {
    const state = kvImageViews(pages);
    const seq = await this.acquire();
    const file = this.stateFile();
    try {
      const fd = openSync(file, 'w');
      try {
        writeViews(fd, state);
      } finally {
        closeSync(fd);
      }
      await seq.loadStateFromFile(file, { acceptRisk: true });
      // The image must be this room's: the context it holds is the request's tokens.
      const held = seq.contextTokens;
      if (held.length !== context.length || held.some((t, i) => t !== context[i])) {
        throw new KvImageError(
          `the KV image holds ${held.length} tokens that are not the request's ${context.length}`,
        );
      }
    } catch (err) {
      await this.giveBack(seq);
      if (err instanceof KvImageError) throw err;
      throw new KvImageError(`llama.cpp could not load the KV image: ${(err as Error).message}`);
    } finally {
      rmSync(file, { force: true });
    }
    // The text stream as it stands after the first token in one process (a token that ends
    // mid-character waits for the next).
    const text = new TextStream(this.model, context);
    text.push(first.token);
    return this.stream(seq, [first.token], [...context, first.token], sampling, text);
  }

  /** Generation on `seq` after evaluating `input`; the sequence goes back when it is closed. */
  private stream(
    seq: LlamaContextSequence,
    input: readonly number[],
    context: readonly number[],
    sampling: Sampling,
    text: TextStream = new TextStream(this.model, context),
  ): DecodeStream {
    const it = (
      greedyUnpenalized(sampling)
        ? seq.evaluate(input as Token[], { temperature: 0 })
        : this.sampled(seq, input, context, sampling)
    )[Symbol.asyncIterator]();
    // Steps and the close run one after another: a close waits for the step in flight.
    let chain: Promise<unknown> = Promise.resolve();
    let closed = false;
    return {
      next: () => {
        const step = chain.then(async () => {
          if (closed) return null;
          const t0 = nowMicros();
          const r = await it.next();
          if (r.done) return null;
          return { token: r.value, text: text.push(r.value), micros: nowMicros() - t0 };
        });
        chain = step.catch(() => {});
        return step;
      },
      close: () => {
        if (closed) return;
        closed = true;
        const done = chain
          .then(async () => {
            await it.return?.(undefined);
            await this.giveBack(seq);
          })
          .catch(() => {})
          .finally(() => this.closing.delete(done));
        this.closing.add(done);
        chain = done;
      },
    };
  }

  /**
   * Tokens drawn one at a time, each with its position's seed (`sampleOptions`): a sampler made
   * once per evaluation would draw from one random stream, and a room continuing a migrated one
   * would start that stream again where the first room was cut.
   */
  private async *sampled(
    seq: LlamaContextSequence,
    input: readonly number[],
    context: readonly number[],
    sampling: Sampling,
  ): AsyncGenerator<Token> {
    const seen = [...context];
    let next = [...input] as Token[];
    for (;;) {
      const last = next.length - 1;
      const out = await seq.controlledEvaluate([
        ...next.slice(0, last),
        [
          next[last] as Token,
          { generateNext: { token: true, options: sampleOptions(sampling, seen) } },
        ],
      ]);
      const token = out[last]?.next?.token;
      if (token === undefined || token === null || this.model.isEogToken(token)) return;
      yield token;
      seen.push(token);
      next = [token];
    }
  }

  /**
   * Plain node-llama-cpp in this process, one sequence from the prompt to the end, no KV image:
   * what a completion through the engines must equal (greedy, or the same seed), and the
   * baseline of `npm run bench:model`.
   */
  async generate(
    tokens: readonly number[],
    maxTokens: number,
    sampling: Sampling = {},
  ): Promise<{ text: string; tokens: number[]; firstTokenMs: number }> {
    const seq = await this.acquire();
    const stream = this.stream(seq, tokens, tokens, sampling);
    const t0 = performance.now();
    let firstTokenMs = 0;
    let out = '';
    const ids: number[] = [];
    try {
      while (ids.length < maxTokens) {
        const step = await stream.next();
        if (step === null) break;
        if (ids.length === 0) firstTokenMs = performance.now() - t0;
        out += step.text;
        ids.push(step.token);
      }
    } finally {
      stream.close();
    }
    return { text: out, tokens: ids, firstTokenMs };
  }

  /** The text generated `ids` make after `context`, as a decode stream gives it. */
  text(ids: readonly number[], context: readonly number[]): string {
    const stream = new TextStream(this.model, context);
    return ids.map((id) => stream.push(id)).join('');
  }

  async close(): Promise<void> {
    await Promise.all(this.closing);
    await this.context.dispose();
    await this.model.dispose();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/**
 * The KV image size of a room of n tokens, from the model itself: a saved state grows by the
 * same bytes for every token (its K and V rows), on top of a fixed part. Measured at 1, 2 and 7
 * tokens, and refused if they do not lie on one line.
 */
async function calibrate(
  model: LlamaModel,
  seq: LlamaContextSequence,
  dir: string,
): Promise<KvShape> {
  const token = (model.tokenize('a')[0] ?? 0) as Token;
  const size = async (n: number) => {
    await seq.evaluateWithoutGeneratingNewTokens(Array.from({ length: n }, () => token));
    const file = join(dir, `calibrate-${n}.state`);
    await seq.saveStateToFile(file);
    const bytes = readFileSync(file).length;
    rmSync(file);
    await seq.clearHistory();
    return bytes;
  };
  const [one, two, seven] = [await size(1), await size(2), await size(7)];
  const perToken = two - one;
  const base = one - perToken;
  if (perToken <= 0 || base < 0 || seven !== base + 7 * perToken) {
    throw new Error(
      `llama.cpp's saved state does not grow linearly with tokens (${one}, ${two}, ${seven} bytes at 1, 2, 7); this model cannot be served`,
    );
  }
  return { baseBytes: base + KV_IMAGE_HEADER_BYTES, bytesPerToken: perToken, decodeGrows: false };
}

/**
 * Whether continuing a sequence from a prefix it holds costs less than computing the whole prompt
 * again, measured on `seq` (empty before and after): the time to evaluate CHECK_TOKENS tokens on it
 * empty against the time to evaluate the last CHECK_CONTINUED of them after the rest, the best of
 * two runs each. llama.cpp's flash attention on a CPU continues a sequence several times slower per
 * token than it evaluates an empty one, so there reuse costs more than it saves.
 */
async function continuationCheck(
  model: LlamaModel,
  seq: LlamaContextSequence,
): Promise<ContinuationCheck> {
  const vocab = model.tokenize('the quick brown fox jumps over the lazy dog');
  const tokens = Array.from({ length: CHECK_TOKENS }, (_, i) => vocab[i % vocab.length] as Token);
  const held = tokens.slice(0, CHECK_TOKENS - CHECK_CONTINUED);
  const rest = tokens.slice(CHECK_TOKENS - CHECK_CONTINUED);
  const timed = async (run: () => Promise<void>): Promise<number> => {
    const t0 = performance.now();
    await run();
    return performance.now() - t0;
  };
  let coldMs = Number.POSITIVE_INFINITY;
  let continueMs = Number.POSITIVE_INFINITY;
  for (let round = 0; round < 2; round++) {
    coldMs = Math.min(coldMs, await timed(() => seq.evaluateWithoutGeneratingNewTokens(tokens)));
    await seq.clearHistory();
    await seq.evaluateWithoutGeneratingNewTokens(held);
    continueMs = Math.min(
      continueMs,
      await timed(() => seq.evaluateWithoutGeneratingNewTokens(rest)),
    );
    await seq.clearHistory();
  }
  const round = (ms: number) => Math.round(ms * 100) / 100;
  return { coldMs: round(coldMs), continueMs: round(continueMs), pays: continueMs < coldMs / 2 };
}
