/**
 * A llama.cpp model through pdctl against the same model in-process: tokens per second and time to
 * first token of rooms through the whole stack (control plane, bus, journal, one prefill and one
 * decode engine process, the KV state moved by the transfer core), against node-llama-cpp in this
 * process with the same model, prompts, sequences and threads, measured in the same run. Also the
 * KV bytes one room moves and the transfer's share of its time to first token.
 *
 * Three stacks run one after the other, each against the baseline measured in its own rounds:
 * the engines as `pdctl serve` starts them (`--prefix-reuse auto`), with reuse forced on
 * (`--prefix-reuse on`), and with it off (`--prefix-cache-pages 0`); and two sets of prompts:
 * distinct ones, and ones sharing their first `--shared-words` words (a system prompt). The default
 * must never be slower than reuse off: at 8 concurrent, prefills continuing from what their
 * sequences held once took three times as long (docs/benchmarks.md, "bench:model").
 *
 * Before the stacks, the model work alone, split as the engines split it, with no hop between: a
 * lone room's parts (tokenize, prefill with the first token drawn, KV save, KV load, the second
 * token's step), and for each concurrency above 1 that many rooms' prefills at once and their
 * loads and second tokens on a second context — each against in-process first tokens of the same
 * prompts.
 *
 * The model is a generated GGUF (src/model/tiny-gguf.ts) wider and deeper than the test one, so
 * that a token costs compute the way a real model's does (about a millisecond here).
 *
 *   npm run bench:model                     # a table
 *   npm run bench:model -- --json           # one JSON object with stable keys
 *   npm run bench:model -- --embedding 512 --layers 8 --rounds 5
 *   npm run bench:model -- --concurrency 1 --rounds 40   # TTFT of a lone room, more rounds
 *   npm run bench:model -- --gpu auto      # node-llama-cpp's CUDA build, where there is a GPU
 *   npm run bench:model -- --prompts shared --shared-words 224   # only prompts sharing 224 words
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { startStack } from '../src/app/stack.ts';
import type { RoomStream } from '../src/control/intake/streams.ts';
import { ENGINE_DEFAULTS, llamaEngineFlags } from '../src/engine/options.ts';
import { silentLogger } from '../src/log.ts';
import { pagesFor } from '../src/model/executor.ts';
import { LlamaEngineModel } from '../src/model/llama/engine-model.ts';
import { LlamaModelInfo } from '../src/model/llama/model-info.ts';
import { writeTinyModel } from '../src/model/tiny-gguf.ts';
import { WORDS } from '../src/model/words.ts';
import { ROOM_PATH } from '../src/room/states.ts';
import { asJson, checkFlags, flag, percentile, say } from './args.ts';

const EMBEDDING = Number(flag('--embedding', '256'));
const LAYERS = Number(flag('--layers', '4'));
const ROUNDS = Number(flag('--rounds', '5'));
const PROMPT_WORDS = Number(flag('--prompt-words', '256'));
const MAX_TOKENS = Number(flag('--max-tokens', '64'));
const GPU = flag('--gpu', 'cpu') === 'auto' ? 'auto' : 'cpu';
const SEQUENCES = 8;
const CONCURRENCY = flag('--concurrency', '1,8').split(',').map(Number);
const SHARED_WORDS = Number(flag('--shared-words', '192'));
const PROMPT_SETS = flag('--prompts', 'distinct,shared').split(',') as PromptSet[];
type PromptSet = 'distinct' | 'shared';
checkFlags();
if (PROMPT_SETS.some((p) => p !== 'distinct' && p !== 'shared')) {
  process.stderr.write('--prompts takes distinct, shared or both, comma-separated\n');
  process.exit(2);
}
if (CONCURRENCY.some((c) => !Number.isInteger(c) || c < 1 || c > SEQUENCES)) {
  process.stderr.write(
    `--concurrency takes counts of rooms from 1 to ${SEQUENCES}, comma-separated, e.g. 1,8\n`,
  );
  process.exit(2);
}
const CONTEXT = 1024;
/** One thread per engine and for the baseline: each engine process computes on one core. */
const THREADS = 1;

interface Run {
  tokens: number;
  wallMs: number;
  ttftMs: number[];
}

interface Row {
  concurrency: number;
  prompts: PromptSet;
  /** The engines' flags: as serve starts them, with prefix reuse forced on, or off. */
  engines: 'default' | 'reuse on' | 'reuse off';
  inProcessTokensPerSec: number;
  pdctlTokensPerSec: number;
  ratio: number;
  inProcessTtftMsP50: number;
  pdctlTtftMsP50: number;
  /** pdctl's TTFT p50 over in-process's. */
  ttftRatio: number;
  /** Prefix blocks a room's prefill reused (p50); null where the engines name no blocks. */
  reusedBlocksP50: number | null;
  kvBytesPerRoom: number;
  transferMsP50: number;
  transferShareOfTtft: number;
  /**
   * ms from submit (p50) to the commit of each step of a room's path through pdctl, and to its
   * first token at the client; `prefillComputeMs`: the prefill engine's compute, KV save included.
   */
  steps: Record<string, number>;
  prefillComputeMsP50: number | null;
  failed: number;
}

/** Prompt `i`; `shared`: its first SHARED_WORDS words are every prompt's. */
function promptOf(i: number, set: PromptSet): string {
  return Array.from({ length: PROMPT_WORDS }, (_, k) => {
    const from = set === 'shared' && k < SHARED_WORDS ? 0 : i;
    return WORDS[(from * 31 + k * 7 + (k >> 3)) % WORDS.length];
  }).join(' ');
}

function median(values: number[]): number {
  return percentile(
    [...values].sort((a, b) => a - b),
    50,
  );
}

async function inProcess(model: LlamaEngineModel, prompts: number[][]): Promise<Run> {
  const t0 = performance.now();
  const outs = await Promise.all(prompts.map((p) => model.generate(p, MAX_TOKENS)));
  return {
    tokens: outs.reduce((n, o) => n + o.tokens.length, 0),
    wallMs: performance.now() - t0,
    ttftMs: outs.map((o) => o.firstTokenMs),
  };
}

async function firstChunk(stream: RoomStream, t0: number): Promise<{ ttft: number; ok: boolean }> {
  let ttft = Number.NaN;
  try {
    for await (const _ of stream) if (Number.isNaN(ttft)) ttft = performance.now() - t0;
    return { ttft, ok: true };
  } catch {
    return { ttft, ok: false };
  }
}

/** What the rooms of one stack and row moved and reused, as their journal says. */
function rooms() {
  return {
    kvBytes: [] as number[],
    transferMs: [] as number[],
    reusedBlocks: [] as number[],
    /** ms from submit to each step of the room's path (its event's commit), and to its first token at the client. */
    at: new Map<string, number[]>(),
    /** The prefill engine's compute for the room, KV state save included (`computeMicros`), ms. */
    prefillComputeMs: [] as number[],
    failed: 0,
  };
}

/**
 * A lone room's model work split as the engines do it, in this process with the engines' own model
 * code, against the same prompt's in-process first token (one evaluation of every prompt token
 * and a sample), interleaved round by round: what pdctl's first token pays in the model before any
 * hop — tokenizing (the control plane's) and the prefill's compute (every prompt token, in slices,
 * and the first token drawn from the last one's logits: protocol 9) — and what comes after it, off
 * the first token's path: saving llama.cpp's state into the pages, loading it on the decode side,
 * and the decode side's first step (the first token evaluated, the second drawn). ms, p50 of
 * `rounds`.
 */
interface ModelWork {
  rounds: number;
  promptTokens: number;
  tokenizeMs: number;
  prefillComputeMs: number;
  kvSaveMs: number;
  kvLoadMs: number;
  secondTokenStepMs: number;
  /** Tokenize and prefill compute: the split's first token. */
  firstTokenMs: number;
  inProcessTtftMs: number;
}

async function modelWork(model: LlamaEngineModel, info: LlamaModelInfo): Promise<ModelWork> {
  const ms = {
    tokenize: [] as number[],
    compute: [] as number[],
    save: [] as number[],
    load: [] as number[],
    step: [] as number[],
    inProcess: [] as number[],
  };
  let promptTokens = 0;
  for (let round = 0; round < ROUNDS; round++) {
    const text = promptOf(10_000 + round, 'distinct');
    let t = performance.now();
    const tokens = info.tokenize(text);
    ms.tokenize.push(performance.now() - t);
    promptTokens = tokens.length;
    // The room's pages as an engine with the default page size reserves them.
    const { pageBytes } = ENGINE_DEFAULTS;
    const pages = Array.from(
      { length: pagesFor(model.kv, pageBytes, tokens.length) },
      () => new Uint8Array(pageBytes),
    );
    const inProcessFirst = async () =>
      ms.inProcess.push((await model.generate(tokens, 1)).firstTokenMs);
    if (round % 2 === 1) await inProcessFirst();
    const done = await model.prefill(tokens, pages, async () => true);
    if (!done?.first) throw new Error('prefill stopped, or drew no first token');
    ms.compute.push((done.micros - done.saveMicros) / 1000);
    ms.save.push(done.saveMicros / 1000);
    t = performance.now();
    const stream = await model.startDecode(tokens, done.first, pages, {});
    ms.load.push(performance.now() - t);
    t = performance.now();
    await stream.next();
    ms.step.push(performance.now() - t);
    stream.close();
    if (round % 2 === 0) await inProcessFirst();
  }
  const p50 = (v: number[]) => Number(median(v).toFixed(2));
  return {
    rounds: ROUNDS,
    promptTokens,
    tokenizeMs: p50(ms.tokenize),
    prefillComputeMs: p50(ms.compute),
    kvSaveMs: p50(ms.save),
    kvLoadMs: p50(ms.load),
    secondTokenStepMs: p50(ms.step),
    firstTokenMs: Number((p50(ms.tokenize) + p50(ms.compute)).toFixed(2)),
    inProcessTtftMs: p50(ms.inProcess),
  };
}

/**
 * The model work of `n` concurrent rooms as the engines split it, with no hop between: their
 * prefills at once (every prompt token, the first token drawn, then the state's save), each room's
 * state loaded as soon as its prefill is done, and the decode side's first step (the answer's
 * second token) asked for as soon as it is loaded — what the engines do, each side on its own
 * context (one thread each, as each engine process has), here in one process with no bus or
 * journal between. ms from the start (p50 over the rooms of ROUNDS rounds), against the in-process
 * first tokens of the same prompts evaluated together, interleaved round by round.
 */
interface ConcurrentWork {
  concurrency: number;
  rounds: number;
  firstTokenMs: number;
  prefillDoneMs: number;
  loadedMs: number;
  secondTokenMs: number;
  inProcessTtftMs: number;
}

async function concurrentWork(
  model: LlamaEngineModel,
  decoder: LlamaEngineModel,
  info: LlamaModelInfo,
  n: number,
): Promise<ConcurrentWork> {
  const at = {
    first: [] as number[],
    prefilled: [] as number[],
    loaded: [] as number[],
    second: [] as number[],
  };
  const inProcessMs: number[] = [];
  const { pageBytes } = ENGINE_DEFAULTS;
  for (let round = 0; round < ROUNDS; round++) {
    const prompts = Array.from({ length: n }, (_, i) =>
      info.tokenize(promptOf(20_000 + round * 100 + i, 'distinct')),
    );
    const inProcessFirst = async () =>
      inProcessMs.push(
        ...(await Promise.all(prompts.map((p) => model.generate(p, 1)))).map((o) => o.firstTokenMs),
      );
    if (round % 2 === 1) await inProcessFirst();
    const t0 = performance.now();
    await Promise.all(
      prompts.map(async (tokens) => {
        const pages = Array.from(
          { length: pagesFor(model.kv, pageBytes, tokens.length) },
          () => new Uint8Array(pageBytes),
        );
        const done = await model.prefill(tokens, pages, async () => true, {
          first: () => at.first.push(performance.now() - t0),
        });
        if (!done?.first) throw new Error('prefill stopped, or drew no first token');
        at.prefilled.push(performance.now() - t0);
        const stream = await decoder.startDecode(tokens, done.first, pages, {});
        at.loaded.push(performance.now() - t0);
        try {
          await stream.next();
          at.second.push(performance.now() - t0);
        } finally {
          stream.close();
        }
      }),
    );
    if (round % 2 === 0) await inProcessFirst();
  }
  const p50 = (v: number[]) => Number(median(v).toFixed(1));
  return {
    concurrency: n,
    rounds: ROUNDS,
    firstTokenMs: p50(at.first),
    prefillDoneMs: p50(at.prefilled),
    loadedMs: p50(at.loaded),
    secondTokenMs: p50(at.second),
    inProcessTtftMs: p50(inProcessMs),
  };
}

/** The step where the first token reached the client (not an event: the client saw it). */
const FIRST_TOKEN = 'first token at the client';

function push(into: Map<string, number[]>, key: string, v: number): void {
  const list = into.get(key) ?? [];
  list.push(v);
  into.set(key, list);
}

/** One round of `texts` at once through `stack`, its rooms' journal facts added to `into`. */
async function throughStack(
  stack: Awaited<ReturnType<typeof startStack>>,
  texts: string[],
  into: ReturnType<typeof rooms>,
): Promise<Run> {
  const t0 = performance.now();
  const wall0 = Date.now();
  const streams = texts.map((prompt) =>
    stack.control.submit({ prompt, maxTokens: MAX_TOKENS, source: 'bench' }),
  );
  const firsts = await Promise.all(streams.map((s) => firstChunk(s, t0)));
  const wallMs = performance.now() - t0;
  into.failed += firsts.filter((f) => !f.ok).length;
  for (const [i, s] of streams.entries()) {
    const t = await stack.control.journal.timeline(s.room);
    for (const type of ROOM_PATH) {
      const e = t.events.find((x) => x.type === type);
      if (e) push(into.at, type, e.ts - wall0);
    }
    const first = firsts[i]?.ttft;
    if (first !== undefined && !Number.isNaN(first)) push(into.at, FIRST_TOKEN, first);
    const moved = t.events.find((e) => e.type === 'room.transfer_completed');
    const posted = t.events.find((e) => e.type === 'room.transfer_posted');
    if (posted && typeof posted.data.computeMicros === 'number')
      into.prefillComputeMs.push(posted.data.computeMicros / 1000);
    if (posted && typeof posted.data.reusedBlocks === 'number')
      into.reusedBlocks.push(posted.data.reusedBlocks);
    if (!moved) continue;
    into.kvBytes.push(moved.data.bytes as number);
    into.transferMs.push((moved.data.micros as number) / 1000);
  }
  return {
    tokens: streams.reduce((n, s) => n + s.tokens, 0),
    wallMs,
    ttftMs: firsts.map((f) => f.ttft),
  };
}

const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-model-'));
const rows: Row[] = [];
let work: ModelWork | null = null;
const concurrent: ConcurrentWork[] = [];
try {
  const path = join(dir, 'bench.gguf');
  const fileBytes = writeTinyModel(path, { embedding: EMBEDDING, layers: LAYERS, heads: 8 });
  const shape = {
    modelPath: path,
    sequences: SEQUENCES,
    contextSize: CONTEXT,
    gpu: GPU,
  } as const;
  const info = await LlamaModelInfo.open(shape);
  const model = await LlamaEngineModel.open({ ...shape, threads: THREADS });
  say(
    `model: ${EMBEDDING}-wide, ${LAYERS} layers, ${fileBytes} bytes; KV ${model.kv.bytesPerToken} bytes/token`,
  );
  say('the model work of a lone room, in this process');
  work = await modelWork(model, info);
  if (CONCURRENCY.some((c) => c > 1)) {
    // The decode side's own context, as the decode engine has.
    const decoder = await LlamaEngineModel.open({ ...shape, threads: THREADS });
    try {
      for (const n of CONCURRENCY.filter((c) => c > 1)) {
        say(`the model work of ${n} concurrent rooms, in this process`);
        concurrent.push(await concurrentWork(model, decoder, info, n));
      }
    } finally {
      await decoder.close();
    }
  }
  const engineArgs = [...llamaEngineFlags({ ...shape, threads: THREADS }), '--chunk-tokens', '1'];
  const stack = (name: string, extra: string[]) =>
    startStack({
      journalPath: join(dir, `${name}.db`),
      durability: 'power',
      log: silentLogger,
      version: 'bench',
      model: info,
      engineArgs: [...engineArgs, ...extra],
      restartStalled: false,
    });
  // One stack at a time (two control planes cannot share a process: ZeroMQ's ZAP endpoint), each
  // against the in-process baseline measured in its own rounds.
  const configs = [
    ['default', []],
    ['reuse on', ['--prefix-reuse', 'on']],
    ['reuse off', ['--prefix-cache-pages', '0']],
  ] as const;
  try {
    for (const [engines, extra] of configs) {
      const running = await stack(engines.replace(' ', '-'), [...extra]);
      try {
        for (const concurrency of CONCURRENCY) {
          for (const set of PROMPT_SETS) {
            rows.push(await row(running, engines, concurrency, set));
          }
        }
      } finally {
        await running.stop();
      }
    }
  } finally {
    await model.close();
    await info.close();
  }

  /** One row: ROUNDS rounds of `concurrency` prompts of `set`, in-process and through `running`. */
  async function row(
    running: Awaited<ReturnType<typeof startStack>>,
    engines: Row['engines'],
    concurrency: number,
    set: PromptSet,
  ): Promise<Row> {
    const base: Run[] = [];
    const pd: Run[] = [];
    const r = rooms();
    for (let round = 0; round < ROUNDS; round++) {
      const texts = Array.from({ length: concurrency }, (_, i) => promptOf(round * 100 + i, set));
      // Alternate which goes first, so that neither always runs on a warmer machine.
      const order = round % 2 === 0 ? ['base', 'pd'] : ['pd', 'base'];
      for (const which of order) {
        if (which === 'base') {
          base.push(
            await inProcess(
              model,
              texts.map((t) => info.tokenize(t)),
            ),
          );
        } else pd.push(await throughStack(running, texts, r));
      }
      say(`  ${engines}, ${concurrency} concurrent, ${set} prompts: round ${round + 1}/${ROUNDS}`);
    }
    const tps = (runs: Run[]) => median(runs.map((x) => (x.tokens * 1000) / x.wallMs));
    const ttft = (runs: Run[]) => median(runs.flatMap((x) => x.ttftMs));
    const pdTtft = ttft(pd);
    return {
      concurrency,
      prompts: set,
      engines,
      inProcessTokensPerSec: Math.round(tps(base)),
      pdctlTokensPerSec: Math.round(tps(pd)),
      ratio: Number((tps(pd) / tps(base)).toFixed(3)),
      inProcessTtftMsP50: Number(ttft(base).toFixed(1)),
      pdctlTtftMsP50: Number(pdTtft.toFixed(1)),
      ttftRatio: Number((pdTtft / ttft(base)).toFixed(3)),
      reusedBlocksP50: r.reusedBlocks.length > 0 ? median(r.reusedBlocks) : null,
      kvBytesPerRoom: Math.round(median(r.kvBytes)),
      transferMsP50: Number(median(r.transferMs).toFixed(3)),
      transferShareOfTtft: Number((median(r.transferMs) / pdTtft).toFixed(4)),
      steps: Object.fromEntries(
        [...ROOM_PATH, FIRST_TOKEN]
          .filter((k) => r.at.has(k))
          .map((k) => [k, Number(median(r.at.get(k) as number[]).toFixed(1))]),
      ),
      prefillComputeMsP50:
        r.prefillComputeMs.length > 0 ? Number(median(r.prefillComputeMs).toFixed(2)) : null,
      failed: r.failed,
    };
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}

if (asJson) {
  process.stdout.write(
    `${JSON.stringify({ bench: 'model', cores: cpus().length, node: process.version, gpu: GPU, embedding: EMBEDDING, layers: LAYERS, rounds: ROUNDS, promptWords: PROMPT_WORDS, sharedWords: SHARED_WORDS, maxTokens: MAX_TOKENS, sequences: SEQUENCES, threads: THREADS, rows, modelWork: work, concurrentModelWork: concurrent }, null, 2)}\n`,
  );
} else {
  const out = [
    `pdctl model benchmark — ${cpus().length} cores, node ${process.version}, llama.cpp ${GPU === 'cpu' ? 'CPU' : 'GPU if any'}; a generated llama model ${EMBEDDING} wide, ${LAYERS} layers,`,
    `prompt ${PROMPT_WORDS} words (shared: the first ${SHARED_WORDS} the same in every prompt), ${MAX_TOKENS} tokens out, ${SEQUENCES} sequences, ${THREADS} thread per engine; median of ${ROUNDS} rounds.`,
    'pdctl: 1 prefill + 1 decode engine, as serve starts them (default: --prefix-reuse auto), with --prefix-reuse on, and with --prefix-cache-pages 0 (reuse off). Baseline: node-llama-cpp in this process, same model, sequences, threads.',
    '',
    '| concurrent | prompts | engines | in-process tok/s | pdctl tok/s | ratio | in-process TTFT p50 ms | pdctl TTFT p50 ms | TTFT / in-process | reused blocks p50 | KV bytes/room | transfer p50 ms | transfer / TTFT | failed |',
    '|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
    ...rows.map(
      (r) =>
        `| ${r.concurrency} | ${r.prompts} | ${r.engines} | ${r.inProcessTokensPerSec} | ${r.pdctlTokensPerSec} | ${r.ratio} | ${r.inProcessTtftMsP50} | ${r.pdctlTtftMsP50} | ${r.ttftRatio} | ${r.reusedBlocksP50 ?? '–'} | ${r.kvBytesPerRoom} | ${r.transferMsP50} | ${(r.transferShareOfTtft * 100).toFixed(2)} % | ${r.failed} |`,
    ),
    '',
    'Goals: ratio ≥ 0.8 at 8 concurrent; transfer < 5 % of TTFT; no default row slower than its reuse-off row.',
    '',
    "Where a room's time goes: ms from submit (p50) to the commit of each step (the journal's clock: whole ms), and to the first token at the client; in-process TTFT for comparison.",
    '',
    `| concurrent | prompts | engines | ${[...ROOM_PATH.map((t) => t.replace('room.', '')), 'first token (client)'].join(' | ')} | prefill compute + KV save ms | in-process TTFT ms |`,
    `|--:|---|---|${[...ROOM_PATH, FIRST_TOKEN].map(() => '--:').join('|')}|--:|--:|`,
    ...rows.map(
      (r) =>
        `| ${r.concurrency} | ${r.prompts} | ${r.engines} | ${[...ROOM_PATH, FIRST_TOKEN].map((k) => r.steps[k] ?? '–').join(' | ')} | ${r.prefillComputeMsP50 ?? '–'} | ${r.inProcessTtftMsP50} |`,
    ),
  ];
  if (work) {
    out.push(
      '',
      `A lone room's model work as the engines split it, in this process with their model code (${work.promptTokens} prompt tokens, p50 of ${work.rounds} rounds, interleaved with the in-process first token of the same prompt):`,
      '',
      '| tokenize | prefill compute, first token drawn | first token | in-process TTFT | first token / in-process | then: KV save | KV load | second token step |',
      '|--:|--:|--:|--:|--:|--:|--:|--:|',
      `| ${work.tokenizeMs} | ${work.prefillComputeMs} | ${work.firstTokenMs} | ${work.inProcessTtftMs} | ${(work.firstTokenMs / work.inProcessTtftMs).toFixed(3)} | ${work.kvSaveMs} | ${work.kvLoadMs} | ${work.secondTokenStepMs} |`,
    );
  }
  if (concurrent.length > 0) {
    out.push(
      '',
      `Concurrent rooms' model work as the engines split it: their prefills at once on one context (the first token drawn at the end of each, then its KV saved), each room loaded on a second context (the decode side's) when its prefill is done and its second token asked for when loaded; one thread each, no bus or journal between. ms from the start, p50 over the rooms of ${ROUNDS} rounds, interleaved with the in-process first tokens of the same prompts evaluated together:`,
      '',
      '| concurrent | first token | in-process TTFT | first token / in-process | prefill done (KV saved) | loaded | second token |',
      '|--:|--:|--:|--:|--:|--:|--:|',
      ...concurrent.map(
        (c) =>
          `| ${c.concurrency} | ${c.firstTokenMs} | ${c.inProcessTtftMs} | ${(c.firstTokenMs / c.inProcessTtftMs).toFixed(3)} | ${c.prefillDoneMs} | ${c.loadedMs} | ${c.secondTokenMs} |`,
      ),
    );
  }
  process.stdout.write(`${out.join('\n')}\n`);
}
