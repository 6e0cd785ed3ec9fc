/**
 * `stop` sequences used to be applied only to the text sent to the client. The
 * decode engine generated on to max_tokens, the journal said `length` with the full count, and a
 * stream leaked the start of a stop sequence that straddled two chunks. Now the stop reaches the
 * engine, which ends the room with `finishReason: stop` and the tokens it really generated, and no
 * character of a stop sequence (or after it) reaches the client.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DeterministicModel, generateInProcess } from '../../src/model/deterministic.ts';
import { type Served, serve } from '../helpers/serve.ts';

const PROMPT = 'the river carries the light';
let s: Served;
beforeAll(async () => {
  s = await serve(['--canary-interval-ms', '0']);
}, 60_000);
afterAll(async () => {
  await s?.stop();
});

/** The model's text after `n` tokens, and a stop sequence across tokens 4 and 5 (chunks 1 and 2). */
function expected() {
  const model = new DeterministicModel();
  const upTo = (n: number) => generateInProcess(model, PROMPT, n).text;
  const [t3, t4, t5] = [upTo(3), upTo(4), upTo(5)];
  const stop = `${t4.slice(-2)}${t5.slice(t4.length, t4.length + 2)}`;
  const at = t5.indexOf(stop);
  // The stop first appears where it was built: its start is the end of the 4th token.
  expect(at).toBe(t4.length - 2);
  expect(at).toBeGreaterThan(t3.length - 1);
  return { stop, text: t5.slice(0, at) };
}

type Chunk = { choices: Array<{ text: string; finish_reason: string | null }> };

/** A streamed completion: its room, and the SSE events' payloads. */
async function streamed(maxTokens: number, stop: string[]) {
  const res = await fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'pdctl-deterministic-1',
      prompt: PROMPT,
      max_tokens: maxTokens,
      stop,
      stream: true,
    }),
  });
  expect(res.status).toBe(200);
  const events = (await res.text())
    .split('\n\n')
    .filter((l) => l.startsWith('data: {'))
    .map((l) => JSON.parse(l.slice(6)) as Chunk);
  return {
    room: res.headers.get('x-pdctl-room') as string,
    text: events.map((e) => e.choices[0]?.text ?? '').join(''),
    finish: events.at(-1)?.choices[0]?.finish_reason,
  };
}

async function roomOf(room: string) {
  const res = await fetch(`${s.url}/v1/rooms/${room}`);
  return ((await res.json()) as { room: { state: string; tokens: number; finishReason: string } })
    .room;
}

describe('stop sequences', () => {
  it('a stream stops at the sequence: the engine ends the room, and nothing of the stop leaks', async () => {
    const { stop, text } = expected();
    const got = await streamed(500, [stop]);
    expect(got.text).toBe(text);
    // Not one leading character of the stop went out, in any chunk.
    expect(got.text.endsWith(stop.slice(0, 1))).toBe(false);
    expect(got.finish).toBe('stop');
    const room = got.room;
    // The engine stopped at the 5th token, not at max_tokens.
    expect(await roomOf(room)).toMatchObject({
      state: 'completed',
      tokens: 5,
      finishReason: 'stop',
    });
  });

  it('a plain completion stops there too, with the true token count', async () => {
    const { stop, text } = expected();
    const res = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: 'pdctl-deterministic-1',
        prompt: PROMPT,
        max_tokens: 500,
        stop,
      }),
    });
    const body = (await res.json()) as {
      choices: Array<{ text: string; finish_reason: string }>;
      usage: { completion_tokens: number };
      pdctl_room: string;
    };
    expect(body.choices[0]).toMatchObject({ text, finish_reason: 'stop' });
    expect(body.usage.completion_tokens).toBe(5);
    expect(await roomOf(body.pdctl_room)).toMatchObject({ tokens: 5, finishReason: 'stop' });
  });

  it('a held-back prefix that turns out not to be a stop is sent in the end', async () => {
    const model = new DeterministicModel();
    const full = generateInProcess(model, PROMPT, 8).text;
    // The last two characters of the text, plus a character the model never writes: the text
    // ends with a prefix of the stop, held back until the room ends without it.
    const stop = `${full.slice(-2)}\u0007`;
    const got = await streamed(8, [stop]);
    expect(got.text).toBe(full);
    expect(got.finish).toBe('length');
  });
});
