/**
 * A llama.cpp model through real engine processes: prefill engines save each room's KV state into
 * their pages, the transfer core moves them, decode engines load them and generate. Completions
 * equal the model run in this process token for token; abort, migration and a corrupted transfer
 * behave as they do with the built-in model.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RoomEndedError } from '../../src/control/intake/streams.ts';
import { ENTERED_BY, RESTING_STATES, stateAtAbort } from '../helpers/aborts.ts';
import { llamaPrompt, SEQUENCES, type TinyLlama, tinyLlama } from '../helpers/llama.ts';
import { collect, poolsFull, startTestStack, waitFor } from '../helpers/stack.ts';

let tiny: TinyLlama;

beforeAll(async () => {
  tiny = await tinyLlama();
}, 60_000);
afterAll(async () => {
  await tiny?.close();
});

describe('a llama.cpp model across prefill and decode engines', () => {
  it('completes rooms one after another exactly as the model does in one process', async () => {
    const { control } = await startTestStack({ model: tiny.info, engineArgs: tiny.args });
    for (let i = 0; i < 16; i++) {
      const r = { prompt: llamaPrompt(i, 3 + ((i * 37) % 500)), maxTokens: 4 + (i % 4) * 30 };
      const stream = control.submit(r);
      const out = await collect(stream);
      expect(out.error).toBeNull();
      const ref = await tiny.reference.generate(tiny.info.tokenize(r.prompt), r.maxTokens);
      expect(ref.tokens).toHaveLength(r.maxTokens);
      expect(stream.ids, `request ${i}`).toEqual(ref.tokens);
      expect(out.text, `request ${i}`).toBe(ref.text);
      // What crossed is the sequence's saved state, sized from the model.
      const t = await control.journal.timeline(stream.room);
      const moved = t.events.find((e) => e.type === 'room.transfer_completed');
      expect(moved?.data.bytes).toBeGreaterThanOrEqual(
        stream.promptTokens * tiny.reference.kv.bytesPerToken,
      );
    }
  });

  it('reuses the prefix a sequence holds: a prompt that continues an earlier one computes only the rest, token for token as a cold run', async () => {
    // On: `auto` keeps no prompts where continuing costs more than computing (a CPU, docs/model.md).
    const { control } = await startTestStack({
      model: tiny.info,
      engineArgs: [...tiny.args, '--prefix-reuse', 'on'],
    });
    const base = llamaPrompt(3, 300);
    const body = tiny.info.tokenize(base).length - 1; // what the first room's sequence keeps
    const prompts = [base, `${base} ${llamaPrompt(9, 40)}`, `${base} ${llamaPrompt(11, 60)}`];
    for (const [i, prompt] of prompts.entries()) {
      const stream = control.submit({ prompt, maxTokens: 24 });
      const out = await collect(stream);
      expect(out.error).toBeNull();
      const ref = await tiny.reference.generate(tiny.info.tokenize(prompt), 24);
      expect(stream.ids, `prompt ${i}`).toEqual(ref.tokens);
      const t = await control.journal.timeline(stream.room);
      const created = t.events.find((e) => e.type === 'room.created');
      const posted = t.events.find((e) => e.type === 'room.transfer_posted');
      if (created?.type !== 'room.created' || posted?.type !== 'room.transfer_posted')
        throw new Error('the room has no room.created or room.transfer_posted');
      const blocks = i === 0 ? 0 : Math.floor(body / 64);
      expect(blocks === 0 || blocks >= 4).toBe(true);
      // The router expected the blocks the first room's sequence keeps, and the engine reused them.
      expect(created.data.expectedBlocks, `prompt ${i}`).toBe(blocks);
      expect(posted.data.reusedBlocks, `prompt ${i}`).toBe(blocks);
    }
  });

  it('runs as many rooms at once as it has sequences, and queues the rest', async () => {
    const { control } = await startTestStack({ model: tiny.info, engineArgs: tiny.args });
    const requests = Array.from({ length: 24 }, (_, i) => ({
      prompt: llamaPrompt(i, 5 + ((i * 37) % 300)),
      maxTokens: 8 + (i % 5) * 10,
    }));
    const streams = requests.map((r) => control.submit(r));
    const outs = await Promise.all(streams.map(collect));
    // llama.cpp's arithmetic depends on which rooms share a batch, so rooms run together are
    // not compared with a run alone (see docs/model.md); each is whole and self-consistent.
    for (const [i, o] of outs.entries()) {
      const r = requests[i] as (typeof requests)[number];
      const stream = streams[i] as (typeof streams)[number];
      expect(o.error).toBeNull();
      expect(stream.ids).toHaveLength(r.maxTokens);
      expect(o.text).toBe(tiny.reference.text(stream.ids, tiny.info.tokenize(r.prompt)));
    }
    const batched = await control.journal.tail({ type: 'room.decode_started', limit: 100 });
    expect(batched.length).toBe(24);
    const done = Date.now();
    await waitFor('pools back to capacity', () => poolsFull(control, done));
  });

  it('aborts a room in every live state; its sequences and pages are free for the next rooms', async () => {
    const { control, engines } = await startTestStack({
      model: tiny.info,
      engineArgs: [...tiny.args, '--allow-fault-injection'],
      restartStalled: false,
    });
    for (const [i, state] of RESTING_STATES.entries()) {
      // The prefill engine starts on room.created (protocol 7): a room rests in
      // waiting_for_input only while it has not, so it is held (SIGSTOP) until the abort is in.
      const held = state === 'waiting_for_input';
      if (held) engines.signal('prefill-0', 'SIGSTOP');
      // A hung compute holds the room in prefilling or decoding, a delayed transfer in
      // transferring, until the abort is in.
      const [hang, fault] =
        state === 'prefilling'
          ? ['prefill-0', 'compute_hang']
          : state === 'decoding'
            ? ['decode-0', 'compute_hang']
            : state === 'transferring'
              ? ['prefill-0', 'delay:400']
              : [null, null];
      if (hang) expect(control.command(hang, 'inject_fault', null, fault)).toBe(true);
      const stream = control.submit({ prompt: llamaPrompt(i, 40), maxTokens: 200 });
      const sub = control.journal.subscribe(await control.journal.headSeq(), (ev) => {
        if (ev.room === stream.room && ev.type === ENTERED_BY[state]) {
          void control
            .abort(stream.room, 'drill_abort', 'test')
            .finally(() => held && engines.signal('prefill-0', 'SIGCONT'));
        }
      });
      const out = await collect(stream);
      sub.close();
      if (held) engines.signal('prefill-0', 'SIGCONT');
      if (hang) control.command(hang, 'inject_fault', null, 'none');
      expect((out.error as RoomEndedError).state, state).toBe('aborted');
      await waitFor(`room aborted in ${state} released by both engines`, async () => {
        const r = (await control.journal.timeline(stream.room)).room;
        return r?.state === 'aborted' && r.releasedBy.length === 2;
      });
      const t = await control.journal.timeline(stream.room);
      expect(stateAtAbort(t.events), `abort meant for ${state}`).toBe(state);
    }
    // Every sequence of both engines is free again: twice as many rooms as there are sequences
    // all complete.
    const next = await Promise.all(
      Array.from({ length: 2 * SEQUENCES }, (_, i) =>
        collect(control.submit({ prompt: llamaPrompt(50 + i, 12), maxTokens: 6 })),
      ),
    );
    for (const o of next) expect(o.error).toBeNull();
    const done = Date.now();
    await waitFor('pools back to capacity', () => poolsFull(control, done));
  });

  it('a decode engine SIGKILLed mid-stream, or right after the first token: the room continues on another pair with the same tokens, greedy and sampled with a seed', async () => {
    const { control, engines } = await startTestStack({
      model: tiny.info,
      engineArgs: tiny.args,
      decodeEngines: 2,
    });
    // Rounds 2 and 3 sample (temperature 1, a seed; one token at a time): the continuation draws
    // each token with its position's seed, so the text is the undisturbed run's. Round 3's decode
    // engine is killed once the client has the first token, which its prefill engine drew
    // (protocol 9): the new room continues after it.
    const sampled = { temperature: 1, topP: 0.9, seed: 4242 };
    const killAt = [20, 120, 20, 1];
    for (const i of [0, 1, 2, 3]) {
      const r = {
        prompt: llamaPrompt(i, 30 + i * 50),
        maxTokens: i === 3 ? 60 : i === 2 ? 150 : 700,
        ...(i >= 2 ? { sampling: sampled } : {}),
      };
      const stream = control.submit(r);
      // Killed from the reader's loop, the moment enough tokens arrived: the tiny model decodes
      // hundreds of tokens a second, faster than a poll would notice.
      let victim = '';
      let text = '';
      for await (const chunk of stream) {
        text += chunk.text;
        if (victim === '' && stream.tokens >= (killAt[i] as number)) {
          victim = control.room(stream.current)?.decodeEngine as string;
          expect(engines.signal(victim, 'SIGKILL'), `round ${i}: ${victim}`).toBe(true);
        }
      }
      const ref = await tiny.reference.generate(
        tiny.info.tokenize(r.prompt),
        r.maxTokens,
        r.sampling,
      );
      if (r.sampling) {
        const greedy = await tiny.reference.generate(tiny.info.tokenize(r.prompt), r.maxTokens);
        expect(ref.tokens, 'sampling draws other tokens than greedy').not.toEqual(greedy.tokens);
      }
      expect(stream.ids).toEqual(ref.tokens);
      expect(text).toBe(ref.text);
      const t = await control.journal.timeline(stream.room);
      expect(t.room?.state).toBe('migrated');
      const next = await control.journal.timeline(t.room?.migratedTo as string);
      expect(next.room?.state).toBe('completed');
      expect(next.room?.decodeEngine).not.toBe(victim);
      // The new room was prefilled from the prompt and the tokens streamed before the kill.
      const moved = t.events.find((e) => e.type === 'room.migrated')?.data.tokens as number;
      expect(moved).toBeGreaterThanOrEqual(killAt[i] as number);
      expect(next.room?.promptTokens).toBe(stream.promptTokens + moved);
      await waitFor(`${victim} back`, () => control.registry.get(victim)?.delivery.live === true);
    }
  });

  it('a corrupted transfer fails the room before decode loads anything; its client has had only the first token', async () => {
    const { control } = await startTestStack({
      model: tiny.info,
      engineArgs: tiny.args,
      engineEnv: { PDCTL_TRANSFER_FAULT: 'corrupt' },
    });
    const prompts = Array.from({ length: 6 }, (_, i) => llamaPrompt(i, 30));
    const outs = await Promise.all(
      prompts.map((prompt) => collect(control.submit({ prompt, maxTokens: 10 }))),
    );
    for (const [i, o] of outs.entries()) {
      expect((o.error as RoomEndedError).reason).toBe('kv_checksum_mismatch');
      // Drawn by the prefill engine and streamed before the transfer (protocol 9); the retry
      // continued after it, and failed the same way.
      const ref = await tiny.reference.generate(tiny.info.tokenize(prompts[i] as string), 1);
      expect(o.text).toBe(ref.text);
      const t = await control.journal.timeline(o.room);
      expect(t.room?.state).toBe('failed');
      expect(t.events.some((e) => e.type === 'room.decode_started')).toBe(false);
    }
    const done = Date.now();
    await waitFor('pools back to capacity', () => poolsFull(control, done));
  });

  it('refuses an engine whose KV states the others could not load (another --sequences)', async () => {
    const { control, engines } = await startTestStack({
      model: tiny.info,
      engineArgs: tiny.args,
      restartEngines: false,
    });
    const args = [...tiny.args];
    args[args.indexOf('--sequences') + 1] = String(SEQUENCES + 1);
    engines.start({ id: 'decode-9', role: 'decode', args });
    await waitFor('decode-9 refused and exited', async () => {
      const exited = await control.journal.tail({ type: 'engine.exited', engine: 'decode-9' });
      return exited.length > 0;
    });
    const [exited] = await control.journal.tail({ type: 'engine.exited', engine: 'decode-9' });
    expect(exited?.data.code).toBe(1);
    expect(control.registry.get('decode-9')).toBeUndefined();
    const out = await collect(control.submit({ prompt: llamaPrompt(1, 10), maxTokens: 4 }));
    expect(out.error).toBeNull();
  });

  it('a control plane of the built-in model refuses a llama.cpp engine (it would not send token ids)', async () => {
    const plain = await startTestStack({ restartEngines: false });
    plain.engines.start({ id: 'decode-9', role: 'decode', args: tiny.args });
    await waitFor('decode-9 refused by the plain control plane', async () => {
      const exited = await plain.journal.tail({ type: 'engine.exited', engine: 'decode-9' });
      return exited.length > 0;
    });
    expect(plain.control.registry.get('decode-9')).toBeUndefined();
  });
});
