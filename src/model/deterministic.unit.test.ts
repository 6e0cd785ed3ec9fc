import { describe, expect, it } from 'vitest';
import { DeterministicModel, generateInProcess, KvSpan } from './deterministic.ts';

describe('the built-in deterministic model', () => {
  const model = new DeterministicModel();

  it('gives the same readable words for the same prompt, and different words for another', () => {
    const a = generateInProcess(model, 'the quiet harbor at night', 12);
    expect(generateInProcess(new DeterministicModel(), 'the quiet harbor at night', 12)).toEqual(a);
    expect(a.text).toMatch(/^( [a-z]+){12}$/);
    expect(a.promptTokens).toBe(5);
    expect(generateInProcess(model, 'the quiet harbor at noon', 12).text).not.toBe(a.text);
  });

  it('continues a migrated request exactly: prefilling prompt + generated text and decoding on equals the undisturbed run', () => {
    for (const prompt of ['the quiet harbor at night', 'drill request 7 word word', 'x']) {
      const full = generateInProcess(model, prompt, 40).text;
      for (const cut of [1, 9, 39]) {
        const head = generateInProcess(model, prompt, cut).text;
        const tokens = model.contextTokens({ prompt, generated: head });
        expect(tokens.length).toBe(model.tokenize(prompt).length + cut);
        const kv = new KvSpan([new Uint8Array((tokens.length + 40) * 64)], 64);
        model.prefillSpan(tokens, kv);
        let tail = '';
        for (let i = 0; i < 40 - cut; i++) tail += model.decodeStep(kv, tokens.length + i).text;
        expect(head + tail).toBe(full);
      }
    }
    expect(() => model.contextTokens({ prompt: 'a', generated: ' notaword' })).toThrow(
      /not a word this model generates/,
    );
  });

  it('reads the KV it was given: a corrupted byte anywhere in the context changes the next token', () => {
    const tokens = model.tokenize('a lantern in the window of the old tower');
    const fresh = () => new KvSpan([new Uint8Array(64 * 64)], 64);
    const clean = fresh();
    model.prefillSpan(tokens, clean);
    const expected = model.decodeStep(clean, tokens.length).token;
    for (const position of [0, 4, tokens.length - 1]) {
      const kv = fresh();
      model.prefillSpan(tokens, kv);
      (kv.at(position)[17] as number) ^= 0x40;
      expect(model.decodeStep(kv, tokens.length).token, `corrupt position ${position}`).not.toBe(
        expected,
      );
    }
  });

  it('prefills in slices exactly as in one pass', () => {
    const tokens = model.tokenize('one two three four five six seven eight nine ten');
    const whole = new KvSpan([new Uint8Array(64 * 16)], 64);
    const sliced = new KvSpan(
      [new Uint8Array(64 * 4), new Uint8Array(64 * 4), new Uint8Array(64 * 4)],
      64,
    );
    model.prefillSpan(tokens, whole);
    for (let from = 0; from < tokens.length; from += 3)
      model.prefillSpan(tokens, sliced, from, Math.min(tokens.length, from + 3));
    for (let p = 0; p < tokens.length; p++) expect(sliced.at(p)).toEqual(whole.at(p));
  });

  it('keeps positions inside their page and refuses positions past the span', () => {
    const kv = new KvSpan([new Uint8Array(128), new Uint8Array(128)], 64);
    expect(kv.capacityTokens).toBe(4);
    kv.at(2).fill(7);
    expect(kv.pages[1]?.subarray(0, 64).every((b) => b === 7)).toBe(true);
    expect(() => kv.at(4)).toThrow(RangeError);
  });

  it('rejects knobs it cannot honour', () => {
    expect(() => new DeterministicModel({ kvBytesPerToken: 6 })).toThrow(/multiple of 4/);
    expect(() => new DeterministicModel({ decodeUsPerToken: -1 })).toThrow(/decodeUsPerToken/);
    expect(() => new DeterministicModel({ prefillCompute: 'gpu' as never })).toThrow(
      /prefillCompute must be spin or device, got "gpu"/,
    );
    expect(() => new DeterministicModel({ decodeCompute: 'cuda' as never })).toThrow(
      /decodeCompute must be spin or device, got "cuda"/,
    );
  });
});

describe('decode on a simulated device', () => {
  it('gives the words of the CPU, returns each step as a wait that leaves the loop free, and queues the steps of two rooms', async () => {
    const usPerToken = 30_000;
    const device = new DeterministicModel({
      decodeUsPerToken: usPerToken,
      decodeCompute: 'device',
    });
    const prompt = 'the quiet harbor at night';
    const expected = generateInProcess(new DeterministicModel(), prompt, 4).text;
    const tokens = device.tokenize(prompt);
    const firsts: string[] = [];
    const streams = await Promise.all(
      [0, 1].map(async (k) => {
        const pages = [new Uint8Array(4096)];
        const done = await device.prefill(tokens, pages, async () => true);
        if (!done) throw new Error('prefill stopped');
        firsts[k] = done.first.text;
        return device.startDecode(tokens, done.first, pages);
      }),
    );
    const texts = [...firsts];
    const started = performance.now();
    for (let i = 0; i < 3; i++) {
      const steps = streams.map((s) => s.next());
      for (const step of steps) expect(step).toBeInstanceOf(Promise);
      // The loop is free while the device works: an immediate runs before either step is in.
      let ranMeanwhile = false;
      setImmediate(() => {
        ranMeanwhile = true;
      });
      let sawFree = false;
      const results = await Promise.all(
        steps.map(async (step) => {
          const s = await step;
          sawFree ||= ranMeanwhile;
          return s;
        }),
      );
      expect(sawFree).toBe(true);
      results.forEach((r, k) => {
        expect(r?.micros).toBeGreaterThanOrEqual(usPerToken);
        texts[k] += r?.text ?? '';
      });
    }
    expect(texts).toEqual([expected, expected]);
    // One device: six steps of 30 ms one after another (timers may fire a ms early).
    expect(performance.now() - started).toBeGreaterThanOrEqual(6 * 30 - 6);
  });
});

describe('prefill on a simulated device', () => {
  it('writes the same KV as the CPU, holds one device per model in turn, and leaves the CPU free', async () => {
    const usPerToken = 400;
    const device = new DeterministicModel({
      prefillUsPerToken: usPerToken,
      prefillCompute: 'device',
    });
    const cpu = new DeterministicModel();
    const tokens = (seed: string) =>
      device.tokenize(Array.from({ length: 512 }, (_, i) => `${seed}${i}`).join(' '));
    const a = tokens('a');
    const b = tokens('b');
    const pages = () => Array.from({ length: 8 }, () => new Uint8Array(4096));
    const [pa, pb] = [pages(), pages()];
    const started = performance.now();
    const cpuBefore = process.cpuUsage();
    const ends: number[] = [];
    const done = (r: { micros: number } | null) => {
      ends.push(performance.now() - started);
      return r;
    };
    const [ra, rb] = await Promise.all([
      device.prefill(a, pa, async () => true).then(done),
      device.prefill(b, pb, async () => true).then(done),
    ]);
    const cpuMs = (() => {
      const u = process.cpuUsage(cpuBefore);
      return (u.user + u.system) / 1000;
    })();
    // One device: the second room's slice waits for the first's (timers may fire a ms early).
    const slice = (512 * usPerToken) / 1000;
    expect(Math.max(...ends)).toBeGreaterThanOrEqual(2 * slice - 2);
    expect(ra?.micros).toBeGreaterThanOrEqual(512 * usPerToken);
    expect(rb?.micros).toBeGreaterThanOrEqual(512 * usPerToken);
    // The device time is waited, not spun: the process used far less CPU than the device time.
    expect(cpuMs).toBeLessThan(slice);
    for (const [t, p] of [
      [a, pa],
      [b, pb],
    ] as const) {
      const cold = pages();
      await cpu.prefill(t, cold, async () => true);
      expect(Buffer.compare(Buffer.concat(p), Buffer.concat(cold))).toBe(0);
    }
  });
});

describe('the built-in model with a cached prefix', () => {
  const model = new DeterministicModel();
  const prompt = (tail: string) =>
    `${Array.from({ length: 40 }, (_, i) => `shared${i}`).join(' ')} ${tail}`;

  it('gives the same KV and words when a prefix computed for another prompt is copied in', async () => {
    const a = model.tokenize(prompt('first question'));
    const b = model.tokenize(prompt('second question entirely'));
    const page = () => [new Uint8Array(4096), new Uint8Array(4096)];
    const pagesA = page();
    await model.prefill(a, pagesA, async () => true);
    // 32 shared positions from a's pages, the rest computed: as if b had been computed cold.
    const warm = page();
    model.positionalKv.copy(pagesA, 0, warm, 0, 32);
    await model.prefill(b, warm, async () => true, { reused: 32 });
    const cold = page();
    await model.prefill(b, cold, async () => true);
    expect(
      Buffer.compare(Buffer.from(warm[0] as Uint8Array), Buffer.from(cold[0] as Uint8Array)),
    ).toBe(0);
    const words = async (pages: Uint8Array[]) => {
      const first = (await model.prefill(b, pages, async () => true, { reused: b.length }))?.first;
      if (!first) throw new Error('prefill stopped');
      const s = await model.startDecode(b, first, pages);
      let text = first.text;
      for (let i = 1; i < 16; i++) text += (s.next() as { text: string }).text;
      return text;
    };
    const text = await words(warm);
    expect(text).toBe(await words(cold));
    expect(text).toBe(generateInProcess(model, prompt('second question entirely'), 16).text);
  });
});
