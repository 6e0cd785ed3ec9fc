/**
 * `pdctl serve --model tiny.gguf` as a user meets it, through the official `openai` client: text
 * and chat completions, streaming and not, equal to the model run in this process token for
 * token; sampling with a seed; the context limit; stop sequences ending generation in the engine.
 */
import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CONTEXT, GPU, llamaPrompt, type TinyLlama, tinyLlama } from '../helpers/llama.ts';
import { type Served, serve } from '../helpers/serve.ts';

let tiny: TinyLlama;
let s: Served;
let client: OpenAI;
const MODEL = 'tiny.gguf';

beforeAll(async () => {
  tiny = await tinyLlama();
  s = await serve([...tiny.args, '--canary-interval-ms', '0']);
  client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
}, 60_000);

afterAll(async () => {
  expect(await s?.stop()).toBe(0);
  await tiny?.close();
}, 30_000);

async function streamed(body: OpenAI.CompletionCreateParamsNonStreaming) {
  const stream = await client.completions.create({ ...body, stream: true });
  let text = '';
  let finish: string | null = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.text ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return { text, finish };
}

describe('pdctl serve --model', () => {
  it('runs its engines’ model as --context-size, --threads and --gpu say, as llama.cpp reports it', async () => {
    const { engines } = (await (await fetch(`${s.url}/v1/engines`)).json()) as {
      engines: Array<{ runtime: { contextSize: number; threads: number; gpu: string } | null }>;
    };
    expect(engines).toHaveLength(2);
    for (const e of engines) {
      // The model was trained on 2048 tokens (its default context); `--threads 1`, where
      // llama.cpp would take every core.
      expect(e.runtime).toMatchObject({ contextSize: CONTEXT, threads: 1 });
      // --gpu cpu here; `npm run gpu-check` runs this on a GPU host with --gpu auto: CUDA.
      expect(e.runtime?.gpu).toBe(GPU === 'cpu' ? 'cpu' : 'cuda');
    }
  });

  it('lists the model and completes text, streaming and not, as the model does in-process', async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual([MODEL]);
    for (let i = 0; i < 8; i++) {
      const prompt = llamaPrompt(i, 2 + i * 40);
      const maxTokens = 5 + i * 7;
      const ref = await tiny.reference.generate(tiny.info.tokenize(prompt), maxTokens);
      const body = { model: MODEL, prompt, max_tokens: maxTokens, temperature: 0 };
      const done = await client.completions.create(body);
      expect(done.choices[0]?.text, `prompt ${i}`).toBe(ref.text);
      expect(done.usage).toEqual({
        prompt_tokens: tiny.info.tokenize(prompt).length,
        completion_tokens: maxTokens,
        total_tokens: tiny.info.tokenize(prompt).length + maxTokens,
      });
      const live = await streamed(body);
      expect(live.text, `prompt ${i}, streamed`).toBe(ref.text);
      expect(live.finish).toBe('length');
    }
  });

  it("completes a chat in the model's own chat template", async () => {
    const messages = [
      { role: 'system' as const, content: 'the harbor keeps its lanterns' },
      { role: 'user' as const, content: 'tell me about the river' },
    ];
    const { prompt, tokens } = tiny.info.chat(messages);
    expect(prompt).toContain('user: tell me about the river');
    expect(prompt.trimEnd().endsWith('assistant:')).toBe(true);
    const ref = await tiny.reference.generate(tokens, 12);
    const chat = await client.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 12,
      temperature: 0,
    });
    expect(chat.choices[0]?.message.content).toBe(ref.text);
    expect(chat.usage?.prompt_tokens).toBe(tokens.length);
  });

  it('samples with temperature, top_p and top_k, the same way again for the same seed', async () => {
    const prompt = llamaPrompt(3, 30);
    const body = {
      model: MODEL,
      prompt,
      max_tokens: 24,
      temperature: 1.2,
      top_p: 0.95,
      top_k: 50,
    };
    const a = await client.completions.create({ ...body, seed: 7 });
    const b = await client.completions.create({ ...body, seed: 7 });
    const c = await client.completions.create({ ...body, seed: 8 });
    const greedy = await tiny.reference.generate(tiny.info.tokenize(prompt), 24);
    const seeded = await tiny.reference.generate(tiny.info.tokenize(prompt), 24, {
      temperature: 1.2,
      topP: 0.95,
      topK: 50,
      seed: 7,
    });
    expect(a.choices[0]?.text).toBe(b.choices[0]?.text);
    expect(a.choices[0]?.text).toBe(seeded.text);
    expect(c.choices[0]?.text).not.toBe(a.choices[0]?.text);
    expect(a.choices[0]?.text).not.toBe(greedy.text);
  });

  it('draws a seed for each unseeded request (journaled), and honours frequency and presence penalties', async () => {
    const prompt = llamaPrompt(5, 20);
    // A hot temperature: the tiny model is peaked, and at 1 most seeds draw its greedy text.
    const body = { model: MODEL, prompt, max_tokens: 24, temperature: 1.8 };
    // Four at once without a seed: each draws its own, so their texts differ.
    const four = await Promise.all(
      [0, 1, 2, 3].map(() => client.completions.create(body).withResponse()),
    );
    const texts = new Set(four.map((r) => r.data.choices[0]?.text));
    expect(texts.size).toBeGreaterThan(1);
    // The seed each drew is on its room.created, and replays its text exactly — run as it was
    // run: alone. (Rooms computed together share llama.cpp's batches, whose make-up follows
    // their timing, and a batch's logits differ in the last bits from a lone sequence's: at this
    // temperature a draw near a tie can go the other way, which CI's load once showed.)
    const first = await client.completions.create(body).withResponse();
    const room = first.response.headers.get('x-pdctl-room') as string;
    const t = (await (await fetch(`${s.url}/v1/rooms/${room}`)).json()) as {
      events: Array<{ type: string; data: { sampling?: { seed: number; temperature: number } } }>;
    };
    const drawn = t.events.find((e) => e.type === 'room.created')?.data.sampling;
    expect(drawn).toMatchObject({ temperature: 1.8, seed: expect.any(Number) });
    const replay = await client.completions.create({ ...body, seed: drawn?.seed });
    expect(replay.choices[0]?.text).toBe(first.data.choices[0]?.text);

    // Penalties change what is drawn (the text stops repeating itself), exactly as the model
    // does with them in-process.
    const seeded = { ...body, max_tokens: 48, temperature: 1.5, seed: 99 };
    const plain = await client.completions.create(seeded);
    const penalized = await client.completions.create({
      ...seeded,
      frequency_penalty: 2,
      presence_penalty: 2,
    });
    const tokens = tiny.info.tokenize(prompt);
    const reference = { temperature: 1.5, seed: 99 };
    const ref = await tiny.reference.generate(tokens, 48, reference);
    const refPenalized = await tiny.reference.generate(tokens, 48, {
      ...reference,
      frequencyPenalty: 2,
      presencePenalty: 2,
    });
    expect(refPenalized.text, 'the penalties change this text').not.toBe(ref.text);
    expect(plain.choices[0]?.text).toBe(ref.text);
    expect(penalized.choices[0]?.text).toBe(refPenalized.text);
    const biased = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...body, logit_bias: { '50': 10 } }),
    });
    expect(biased.status).toBe(400);
    expect(((await biased.json()) as { error: { param: string } }).error.param).toBe('logit_bias');
  });

  it('refuses a request beyond the context with context_length_exceeded, writing nothing', async () => {
    const prompt = llamaPrompt(4, 100);
    const promptTokens = tiny.info.tokenize(prompt).length;
    const rooms = async () =>
      ((await (await fetch(`${s.url}/v1/stats`)).json()) as { journal: { rooms: number } }).journal
        .rooms;
    const before = await rooms();
    const err = await client.completions
      .create({ model: MODEL, prompt, max_tokens: CONTEXT - promptTokens + 1 })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(OpenAI.BadRequestError);
    expect((err as InstanceType<typeof OpenAI.BadRequestError>).code).toBe(
      'context_length_exceeded',
    );
    expect((err as Error).message).toContain(`context is ${CONTEXT} tokens`);
    expect(await rooms()).toBe(before);
    const fits = await client.completions.create({
      model: MODEL,
      prompt,
      max_tokens: CONTEXT - promptTokens,
      temperature: 0,
    });
    expect(fits.usage?.completion_tokens).toBe(CONTEXT - promptTokens);
  });

  it('ends generation in the engine at a stop sequence', async () => {
    const prompt = llamaPrompt(5, 20);
    const ref = await tiny.reference.generate(tiny.info.tokenize(prompt), 40);
    const words = ref.text.trim().split(' ');
    const stop = ` ${words[6]} ${words[7]}`;
    const { data, response } = await client.completions
      .create({ model: MODEL, prompt, max_tokens: 40, temperature: 0, stop })
      .withResponse();
    expect(data.choices[0]?.finish_reason).toBe('stop');
    expect(data.choices[0]?.text).toBe(ref.text.slice(0, ref.text.indexOf(stop)));
    const room = response.headers.get('x-pdctl-room') as string;
    const t = (await (await fetch(`${s.url}/v1/rooms/${room}`)).json()) as {
      room: { tokens: number; finishReason: string };
    };
    expect(t.room.finishReason).toBe('stop');
    expect(t.room.tokens).toBeLessThan(20);
  });
});
