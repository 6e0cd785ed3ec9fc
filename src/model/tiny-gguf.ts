/**
 * A tiny llama-architecture model in GGUF v3, generated from a seed: what the tests, drills and
 * benchmarks serve through llama.cpp where no model weights can be downloaded. Its weights are
 * random, so its text means nothing, but llama.cpp runs it like any other model — tokenizer (a
 * word vocabulary plus byte tokens), chat template, attention, KV cache — in milliseconds, and the
 * same seed always writes the same file.
 *
 * The format: a header (magic `GGUF`, version 3, tensor and key counts), typed key/value metadata,
 * tensor descriptors (name, dimensions innermost first, type, offset), then the tensor data,
 * every offset aligned to 32 bytes. All numbers little-endian.
 */
import { writeFileSync } from 'node:fs';
import { WORDS } from './words.ts';

export interface TinyModelOptions {
  /** Seeds the weights. Default 1. */
  seed?: number;
  /** Embedding width. Default 64. */
  embedding?: number;
  /** Transformer blocks. Default 2. */
  layers?: number;
  /** Attention heads (the embedding divides into them). Default 4. */
  heads?: number;
  /** Context the model says it supports, in tokens. Default 2048. */
  contextLength?: number;
}

const CHAT_TEMPLATE =
  "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ 'assistant:' }}{% endif %}";

/** GGUF value types. */
enum V {
  U32 = 4,
  I32 = 5,
  F32 = 6,
  Bool = 7,
  Str = 8,
  Array = 9,
}

type Value =
  | [V.U32 | V.I32 | V.F32, number]
  | [V.Bool, boolean]
  | [V.Str, string]
  | [V.Array, V.I32 | V.F32, number[]]
  | [V.Array, V.Str, string[]];

/** Token types of llama.cpp's vocabulary. */
const NORMAL = 1;
const UNKNOWN = 2;
const CONTROL = 3;
const BYTE = 6;

interface Vocabulary {
  tokens: string[];
  scores: number[];
  types: number[];
}

/**
 * SentencePiece-style: `▁` marks a word start; the tokenizer merges characters pair by pair into
 * the highest-scoring piece in the vocabulary, so every prefix of a word is a piece too, scored
 * higher the longer it is. Anything else falls back to byte tokens.
 */
function vocabulary(): Vocabulary {
  const v: Vocabulary = {
    tokens: ['<unk>', '<s>', '</s>'],
    scores: [0, 0, 0],
    types: [UNKNOWN, CONTROL, CONTROL],
  };
  for (let b = 0; b < 256; b++) {
    v.tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
    v.scores.push(0);
    v.types.push(BYTE);
  }
  const seen = new Set(v.tokens);
  const add = (piece: string, score: number) => {
    if (seen.has(piece)) return;
    seen.add(piece);
    v.tokens.push(piece);
    v.scores.push(score);
    v.types.push(NORMAL);
  };
  for (const c of "▁abcdefghijklmnopqrstuvwxyz.,:;!?'-0123456789") add(c, -1000);
  for (const w of WORDS) {
    const piece = `▁${w}`;
    for (let i = 2; i <= piece.length; i++) add(piece.slice(0, i), -1000 + i);
  }
  return v;
}

/** xorshift32, uniform in [-1, 1). */
function random(seed: number): () => number {
  let s = seed >>> 0 || 0x9e3779b9;
  return () => {
    s ^= s << 13;
    s ^= s >>> 17;
    s ^= s << 5;
    return ((s >>> 0) / 2 ** 32) * 2 - 1;
  };
}

class Writer {
  private readonly parts: Buffer[] = [];
  length = 0;

  private push(b: Buffer): void {
    this.parts.push(b);
    this.length += b.length;
  }

  u32(v: number): void {
    const b = Buffer.alloc(4);
    b.writeUInt32LE(v);
    this.push(b);
  }

  u64(v: number): void {
    const b = Buffer.alloc(8);
    b.writeBigUInt64LE(BigInt(v));
    this.push(b);
  }

  string(s: string): void {
    const b = Buffer.from(s, 'utf8');
    this.u64(b.length);
    this.push(b);
  }

  value(v: Value): void {
    this.u32(v[0]);
    this.raw(v);
  }

  private raw(v: Value): void {
    const b = Buffer.alloc(4);
    switch (v[0]) {
      case V.U32:
        b.writeUInt32LE(v[1]);
        this.push(b);
        break;
      case V.I32:
        b.writeInt32LE(v[1]);
        this.push(b);
        break;
      case V.F32:
        b.writeFloatLE(v[1]);
        this.push(b);
        break;
      case V.Bool:
        this.push(Buffer.from([v[1] ? 1 : 0]));
        break;
      case V.Str:
        this.string(v[1]);
        break;
      case V.Array:
        this.u32(v[1]);
        this.u64(v[2].length);
        for (const x of v[2]) this.raw([v[1], x] as Value);
        break;
    }
  }

  bytes(b: Buffer): void {
    this.push(b);
  }

  align(to: number): void {
    const pad = (to - (this.length % to)) % to;
    if (pad > 0) this.push(Buffer.alloc(pad));
  }

  toBuffer(): Buffer {
    return Buffer.concat(this.parts);
  }
}

/** The GGUF bytes of a tiny model. */
export function tinyModelGguf(o: TinyModelOptions = {}): Buffer {
  const embedding = o.embedding ?? 64;
  const layers = o.layers ?? 2;
  const heads = o.heads ?? 4;
  const ff = embedding * 2;
  if (embedding % heads !== 0 || (embedding / heads) % 2 !== 0)
    throw new Error(`embedding ${embedding} must split into ${heads} heads of an even width`);
  const vocab = vocabulary();
  const n = vocab.tokens.length;
  const rnd = random(o.seed ?? 1);

  const meta: Array<[string, Value]> = [
    ['general.architecture', [V.Str, 'llama']],
    ['general.name', [V.Str, `pdctl-tiny-${o.seed ?? 1}`]],
    ['general.alignment', [V.U32, 32]],
    ['llama.context_length', [V.U32, o.contextLength ?? 2048]],
    ['llama.embedding_length', [V.U32, embedding]],
    ['llama.block_count', [V.U32, layers]],
    ['llama.feed_forward_length', [V.U32, ff]],
    ['llama.attention.head_count', [V.U32, heads]],
    ['llama.attention.head_count_kv', [V.U32, heads]],
    ['llama.rope.dimension_count', [V.U32, embedding / heads]],
    ['llama.attention.layer_norm_rms_epsilon', [V.F32, 1e-5]],
    ['llama.vocab_size', [V.U32, n]],
    ['tokenizer.ggml.model', [V.Str, 'llama']],
    ['tokenizer.ggml.tokens', [V.Array, V.Str, vocab.tokens]],
    ['tokenizer.ggml.scores', [V.Array, V.F32, vocab.scores]],
    ['tokenizer.ggml.token_type', [V.Array, V.I32, vocab.types]],
    ['tokenizer.ggml.unknown_token_id', [V.U32, 0]],
    ['tokenizer.ggml.bos_token_id', [V.U32, 1]],
    ['tokenizer.ggml.eos_token_id', [V.U32, 2]],
    ['tokenizer.ggml.add_bos_token', [V.Bool, true]],
    ['tokenizer.chat_template', [V.Str, CHAT_TEMPLATE]],
  ];

  const tensors: Array<{ name: string; dims: number[]; data: Float32Array }> = [];
  const tensor = (name: string, dims: number[], value: (i: number) => number) => {
    const data = new Float32Array(dims.reduce((a, b) => a * b, 1));
    for (let i = 0; i < data.length; i++) data[i] = value(i);
    tensors.push({ name, dims, data });
  };
  const scaled = (fanIn: number) => () => rnd() / Math.sqrt(fanIn);
  tensor('token_embd.weight', [embedding, n], () => rnd());
  for (let l = 0; l < layers; l++) {
    tensor(`blk.${l}.attn_norm.weight`, [embedding], () => 1);
    for (const w of ['q', 'k', 'v', 'output'])
      tensor(`blk.${l}.attn_${w}.weight`, [embedding, embedding], scaled(embedding));
    tensor(`blk.${l}.ffn_norm.weight`, [embedding], () => 1);
    tensor(`blk.${l}.ffn_gate.weight`, [embedding, ff], scaled(embedding));
    tensor(`blk.${l}.ffn_up.weight`, [embedding, ff], scaled(embedding));
    tensor(`blk.${l}.ffn_down.weight`, [ff, embedding], scaled(ff));
  }
  tensor('output_norm.weight', [embedding], () => 1);
  // Rows of the output projection for control and byte tokens stay zero: generation then picks
  // words (whose logits spread around zero), never ends on its own, and never emits half a
  // UTF-8 character.
  tensor('output.weight', [embedding, n], (i) =>
    vocab.types[Math.floor(i / embedding)] === NORMAL ? rnd() * 4 : 0,
  );

  const w = new Writer();
  w.bytes(Buffer.from('GGUF', 'ascii'));
  w.u32(3);
  w.u64(tensors.length);
  w.u64(meta.length);
  for (const [key, value] of meta) {
    w.string(key);
    w.value(value);
  }
  let offset = 0;
  const offsets: number[] = [];
  for (const t of tensors) {
    w.string(t.name);
    w.u32(t.dims.length);
    for (const d of t.dims) w.u64(d);
    w.u32(0); // F32
    w.u64(offset);
    offsets.push(offset);
    offset += Math.ceil(t.data.byteLength / 32) * 32;
  }
  w.align(32);
  const data = Buffer.alloc(offset);
  tensors.forEach((t, i) => {
    Buffer.from(t.data.buffer, t.data.byteOffset, t.data.byteLength).copy(data, offsets[i]);
  });
  w.bytes(data);
  return w.toBuffer();
}

/** Writes a tiny model to `path`; returns its size in bytes. */
export function writeTinyModel(path: string, o: TinyModelOptions = {}): number {
  const bytes = tinyModelGguf(o);
  writeFileSync(path, bytes);
  return bytes.length;
}
