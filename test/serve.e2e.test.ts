/**
 * `pdctl serve` as a user meets it: the official `openai` client against a real subprocess,
 * streaming and not, a mid-stream cancel, bad requests that write nothing, the query routes, the
 * metrics, and SIGTERM.
 */
import { existsSync } from 'node:fs';
import { request } from 'node:http';
import { createServer } from 'node:net';
import { join } from 'node:path';
import OpenAI from 'openai';
import parsePrometheus from 'parse-prometheus-text-format';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chatPrompt, DeterministicModel, generateInProcess } from '../src/model/deterministic.ts';
import { type Served, serve } from './helpers/serve.ts';
import { pdctl, spawnPdctl } from './helpers/spawn.ts';
import { waitFor } from './helpers/stack.ts';
import { tempDir } from './helpers/tmp.ts';

const MODEL = 'pdctl-deterministic-1';
const model = new DeterministicModel();
let s: Served;
let client: OpenAI;

beforeAll(async () => {
  // Slow decode steps so that a stream can be cancelled mid-way; no background canary, so the
  // journal changes only when a test asks.
  s = await serve(['--decode-us-per-token', '2000', '--canary-interval-ms', '0']);
  client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
}, 60_000);

afterAll(async () => {
  expect(await s.stop()).toBe(0);
}, 30_000);

const get = async (path: string) => {
  const r = await fetch(`${s.url}${path}`);
  return { status: r.status, body: (await r.json()) as Record<string, unknown> };
};
const roomsInJournal = async () =>
  ((await get('/v1/stats')).body.journal as { rooms: number }).rooms;

describe('the openai client against pdctl serve', () => {
  it('lists the model and completes text, naming the room', async () => {
    const models = await client.models.list();
    expect(models.data.map((m) => m.id)).toEqual([MODEL]);
    const { data, response } = await client.completions
      .create({ model: MODEL, prompt: 'the quiet harbor', max_tokens: 8 })
      .withResponse();
    expect(data.choices[0]?.text).toBe(generateInProcess(model, 'the quiet harbor', 8).text);
    expect(data.choices[0]?.finish_reason).toBe('length');
    expect(data.usage).toEqual({ prompt_tokens: 3, completion_tokens: 8, total_tokens: 11 });
    const room = response.headers.get('x-pdctl-room') as string;
    expect(data.id).toBe(`cmpl-${room}`);
    const t = await get(`/v1/rooms/${room}`);
    expect(t.status).toBe(200);
    expect((t.body.room as { state: string }).state).toBe('completed');
    // The completion id the client got finds the same room.
    const byId = await get(`/v1/rooms/${data.id}`);
    expect((byId.body.room as { room: string }).room).toBe(room);
    expect((t.body.events as unknown[]).length).toBeGreaterThanOrEqual(8);
  });

  it('completes a chat, streaming and not, and honours a stop sequence', async () => {
    const messages = [
      { role: 'system' as const, content: 'be brief' },
      { role: 'user' as const, content: 'tell me about the river' },
    ];
    const expected = generateInProcess(model, chatPrompt(messages), 10).text;
    const chat = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 10 });
    expect(chat.choices[0]?.message.content).toBe(expected);
    const stream = await client.chat.completions.create({
      model: MODEL,
      messages,
      max_tokens: 10,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish: string | null = null;
    let usage: unknown = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    expect(text).toBe(expected);
    expect(finish).toBe('length');
    expect(usage).toMatchObject({ completion_tokens: 10 });
    const word = (expected.split(' ')[3] as string).trim();
    const stopped = await client.completions.create({
      model: MODEL,
      prompt: chatPrompt(messages),
      max_tokens: 10,
      stop: ` ${word}`,
    });
    expect(stopped.choices[0]?.finish_reason).toBe('stop');
    expect(stopped.choices[0]?.text).toBe(expected.slice(0, expected.indexOf(` ${word}`)));
  });

  it('aborts the room when the client cancels mid-stream', async () => {
    const { data: stream, response } = await client.completions
      .create({ model: MODEL, prompt: 'a long story', max_tokens: 2000, stream: true })
      .withResponse();
    const room = response.headers.get('x-pdctl-room') as string;
    let chunks = 0;
    for await (const _ of stream) {
      if (++chunks === 2) stream.controller.abort();
    }
    await waitFor('the room aborted in the journal', async () => {
      const t = await get(`/v1/rooms/${room}`);
      return (t.body.room as { state: string }).state === 'aborted';
    });
    const t = await get(`/v1/rooms/${room}`);
    expect(t.body.room).toMatchObject({
      state: 'aborted',
      reason: 'client_disconnect',
      abortSource: 'client',
    });
  });

  it('refuses bad requests in OpenAI’s error shape and journals nothing for them', async () => {
    const before = await roomsInJournal();
    const post = (body: string, type = 'application/json') =>
      fetch(`${s.url}/v1/completions`, { method: 'POST', headers: { 'content-type': type }, body });
    const cases: Array<[string, number, RegExp]> = [
      [JSON.stringify({ prompt: 'x' }), 400, /must have required property 'model'/],
      [
        JSON.stringify({ model: MODEL, prompt: 'x', max_tokens: '8' }),
        400,
        /max_tokens must be integer/,
      ],
      [
        JSON.stringify({ model: MODEL, prompt: 'x', max_tokens: 10_000_000 }),
        400,
        /max_tokens must be <= 100000/,
      ],
      // The built-in model's context: 32768 tokens, prompt and max_tokens together.
      [
        JSON.stringify({ model: MODEL, prompt: 'river '.repeat(40_000), max_tokens: 4 }),
        400,
        /^this model's context is 32768 tokens; the prompt has 40000 and max_tokens asks for 4 more/,
      ],
      [JSON.stringify({ model: MODEL, prompt: 'x', n: 3 }), 400, /n must be equal to constant/],
      [JSON.stringify({ model: MODEL, prompt: 'x', best_of: 2 }), 400, /unknown field "best_of"/],
      [JSON.stringify({ model: 'gpt-4', prompt: 'x' }), 404, /model `gpt-4` does not exist/],
      ['{"model": "pdctl-deterministic-1", "prompt": ', 400, /not valid JSON/],
    ];
    for (const [body, status, message] of cases) {
      const r = await post(body);
      const json = (await r.json()) as { error: { message: string; type: string; code: string } };
      expect(r.status, body.slice(0, 80)).toBe(status);
      expect(json.error.message).toMatch(message);
      expect(json.error.type).toBe('invalid_request_error');
      if (/context is/.test(json.error.message))
        expect(json.error.code).toBe('context_length_exceeded');
    }
    // Oversized: a 2 MiB body announced in Content-Length. Only its first bytes are written, so
    // the 413 (sent on the header alone) cannot race a write into a closed connection.
    const big = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const req = request(
        `${s.url}/v1/completions`,
        {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'content-length': String(2 << 20) },
        },
        (res) => {
          let body = '';
          res.on('data', (d: Buffer) => (body += d.toString()));
          res.on('end', () => {
            req.destroy();
            resolve({ status: res.statusCode ?? 0, body });
          });
        },
      );
      req.on('error', (err: NodeJS.ErrnoException) => {
        if (err.code !== 'ECONNRESET') reject(err);
      });
      req.write(`{"model":"${MODEL}","prompt":"${'x'.repeat(1024)}`);
    });
    expect(big.status).toBe(413);
    expect(JSON.parse(big.body)).toMatchObject({
      error: {
        type: 'invalid_request_error',
        code: 'request_too_large',
        message: expect.stringContaining('limit of 1048576 bytes (1 MiB)'),
      },
    });
    // The openai client surfaces them as its own errors.
    await expect(
      client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 0 }),
    ).rejects.toMatchObject({ status: 400 });
    expect(await roomsInJournal()).toBe(before);
  });

  it('pdctl abort, pdctl engines reset and restart act on the running stack', async () => {
    const { data: stream, response } = await client.completions
      .create({ model: MODEL, prompt: 'a long story', max_tokens: 2000, stream: true })
      .withResponse();
    const room = response.headers.get('x-pdctl-room') as string;
    let finish: string | null = null;
    const read = (async () => {
      for await (const chunk of stream) finish = chunk.choices[0]?.finish_reason ?? finish;
    })();
    const aborted = await pdctl(['abort', `cmpl-${room}`, '--reason', 'on-call', '--url', s.url]);
    expect(aborted.code, aborted.stderr).toBe(0);
    expect(aborted.stdout).toMatch(
      new RegExp(`abort of ${room} journaled at seq \\d+ \\(applied\\)`),
    );
    await read;
    expect(finish).toBe('abort');
    const again = await pdctl(['abort', room, '--url', s.url]);
    expect(again.code).toBe(1);
    expect(again.stderr).toMatch(/already/);
    // journal stats reads the server too: with --url, and with PDCTL_URL set (it once read
    // ./data/journal.db of the current directory instead, saying nothing).
    const stats = await pdctl(['journal', 'stats', '--url', s.url]);
    expect(stats.code, stats.stderr).toBe(0);
    const head = stats.stdout.split('\n')[0] as string;
    expect(head).toMatch(
      /^journal {5}\/\S+journal\.db \(schema \d+, [\d.]+ MiB, \d+ bytes a room\)$/,
    );
    expect(stats.stdout).toMatch(/^checkpoint {2}not read through a server/m);
    expect(stats.stdout).toMatch(/^aborts by reason\n/m);
    const viaEnv = await pdctl(['journal', 'stats'], {
      env: { PDCTL_URL: s.url, PDCTL_JOURNAL: '' },
    });
    expect(viaEnv.stdout.split('\n')[0]).toBe(head);
    const perMinute = await pdctl(['journal', 'stats', '--per-minute', '--url', s.url]);
    expect(perMinute.code).toBe(2);
    expect(perMinute.stderr).toMatch(/--per-minute reads the journal itself/);
    const reset = await pdctl(['engines', 'reset', 'decode-0', '--url', s.url]);
    expect(reset.code, reset.stderr).toBe(0);
    expect(reset.stdout).toMatch(/reset_in_place sent to decode-0/);
    await waitFor('decode-0 reset in place, journaled', async () => {
      const r = await fetch(`${s.url}/v1/journal?type=recovery.action&engine=decode-0`);
      return (await r.text()).includes('reset_in_place');
    });
    const engines = async () =>
      (
        (await (await fetch(`${s.url}/v1/engines`)).json()) as {
          engines: Array<{ id: string; pid: number; state: string }>;
        }
      ).engines;
    const before = (await engines()).find((e) => e.id === 'decode-0')?.pid;
    const restart = await pdctl(['engines', 'restart', 'decode-0', '--url', s.url]);
    expect(restart.code, restart.stderr).toBe(0);
    expect(restart.stdout).toMatch(/shutdown sent to decode-0: it finishes its rooms and exits/);
    await waitFor(
      'decode-0 back as a new process',
      async () => {
        const d = (await engines()).find((e) => e.id === 'decode-0');
        return d !== undefined && d.pid !== before && d.state === 'ready';
      },
      20_000,
    );
    const nobody = await pdctl(['engines', 'restart', 'decode-9', '--url', s.url]);
    expect(nobody.code).toBe(1);
    expect(nobody.stderr).toMatch(/decode-9/);
    const bad = await pdctl(['engines', 'reboot', 'decode-0', '--url', s.url]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/unknown action "reboot"/);
    // The stack still serves.
    const next = await client.completions.create({
      model: MODEL,
      prompt: 'the river',
      max_tokens: 4,
    });
    expect(next.choices[0]?.finish_reason).toBe('length');
  });

  it('pdctl rooms and pdctl room read a running stack with --url', async () => {
    const { data, response } = await client.completions
      .create({ model: MODEL, prompt: 'the quiet harbor', max_tokens: 3 })
      .withResponse();
    const room = response.headers.get('x-pdctl-room') as string;
    const list = await pdctl(['rooms', '--url', s.url, '--limit', '500', '--json']);
    expect(list.code, list.stderr).toBe(0);
    const page = JSON.parse(list.stdout) as { rooms: Array<{ room: string; origin: string }> };
    expect(page.rooms.map((r) => r.room)).toContain(room);
    // As from a file, the health canary's rooms are left out unless asked for.
    expect(page.rooms.some((r) => r.origin === 'canary')).toBe(false);
    const one = await pdctl(['room', data.id, '--url', s.url]);
    expect(one.code, one.stderr).toBe(0);
    expect(one.stdout).toMatch(new RegExp(`room ${room}: completed \\(3 tok, length\\)`));
    expect(one.stdout).toMatch(/room\.created/);
    const missing = await pdctl(['room', 'r-nosuchroom-000001', '--url', s.url]);
    expect(missing.code).toBe(1);
    expect(missing.stdout).toMatch(/no room and no request r-nosuchroom-000001 in http/);
    const down = await pdctl(['rooms', '--url', 'http://127.0.0.1:9']);
    expect(down.code).toBe(4);
    expect(down.stderr).toMatch(/cannot reach .*Is pdctl serve running there\? Pass --url\./);
    // PDCTL_URL says the same once for every command; --journal still reads a file.
    const viaEnv = await pdctl(['room', room], { env: { PDCTL_URL: s.url, PDCTL_JOURNAL: '' } });
    expect(viaEnv.code, viaEnv.stderr).toBe(0);
    expect(viaEnv.stdout).toMatch(new RegExp(`room ${room}: completed`));
    const file = await pdctl(['room', room, '--journal', `${s.dataDir}/journal.db`], {
      env: { PDCTL_URL: 'http://127.0.0.1:9' },
    });
    expect(file.code, file.stderr).toBe(0);
    // A name the journal does not hold is an error naming the ones it does, not an empty answer:
    // the server says so (400), and the CLI prints its word (exit 2).
    const d0 = await fetch(`${s.url}/v1/rooms?engine=d0`);
    expect(d0.status).toBe(400);
    expect(await d0.json()).toMatchObject({
      error: {
        code: 'invalid_parameter',
        param: 'engine',
        message:
          'no room or event of this journal names engine "d0"; its engines are: decode-0, prefill-0',
      },
    });
    const tailD0 = await fetch(`${s.url}/v1/journal?engine=d0&since=${Date.now() - 60_000}`);
    expect(tailD0.status).toBe(400);
    for (const args of [
      ['rooms', '--engine', 'd0'],
      ['journal', 'tail', '--engine', 'd0'],
      ['rooms', '--reason', 'decode_died'],
    ]) {
      const r = await pdctl([...args, '--url', s.url]);
      expect(r.code, args.join(' ')).toBe(2);
      expect(r.stderr).toMatch(
        /its engines are: decode-0, prefill-0|"decode_died" is no reason pdctl gives/,
      );
    }
    // A name it holds, or a reason of pdctl's own, at an hour with none: an empty answer.
    const quiet = await fetch(`${s.url}/v1/rooms?engine=decode-0&reason=kv_pool_full`);
    expect(quiet.status).toBe(200);
    expect(await quiet.json()).toMatchObject({ rooms: [] });
    const both = await pdctl(['rooms'], {
      env: { PDCTL_URL: s.url, PDCTL_JOURNAL: '/tmp/elsewhere.db' },
    });
    expect(both.code).toBe(2);
    expect(both.stderr).toMatch(
      /both PDCTL_URL and PDCTL_JOURNAL are set: pass --url or --journal/,
    );
  });

  it('a request id finds its room: /v1/rooms?request_id=, pdctl room <request-id>, pdctl rooms --request-id', async () => {
    const rid = `incident-${Date.now()}/a:b`;
    const res = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-request-id': rid },
      body: JSON.stringify({
        model: MODEL,
        prompt: 'the quiet harbor',
        max_tokens: 3,
        stream: true,
      }),
    });
    expect(res.headers.get('x-request-id')).toBe(rid);
    const room = res.headers.get('x-pdctl-room') as string;
    await res.text();
    const q = await get(`/v1/rooms?request_id=${encodeURIComponent(rid)}`);
    expect(q.status).toBe(200);
    expect(q.body.rooms).toEqual([expect.objectContaining({ room, requestId: rid })]);
    expect((await get('/v1/rooms?request_id=no-such-request')).body.rooms).toEqual([]);
    // From the server and from the file: the timeline; as JSON, and as a listing.
    for (const where of [
      ['--url', s.url],
      ['--journal', `${s.dataDir}/journal.db`],
    ]) {
      const one = await pdctl(['room', rid, ...where], { env: { PDCTL_URL: '' } });
      expect(one.code, one.stderr).toBe(0);
      expect(one.stdout).toContain(`request ${rid}: room ${room}`);
      expect(one.stdout).toMatch(new RegExp(`room ${room}: completed \\(3 tok, length\\)`));
    }
    const json = await pdctl(['room', rid, '--json', '--url', s.url]);
    expect(JSON.parse(json.stdout)).toMatchObject({
      request_id: rid,
      rooms: [{ room: { room, requestId: rid } }],
    });
    const listed = await pdctl(
      ['rooms', '--request-id', rid, '--json', '--journal', `${s.dataDir}/journal.db`],
      { env: { PDCTL_URL: '' } },
    );
    expect(JSON.parse(listed.stdout).rooms.map((r: { room: string }) => r.room)).toEqual([room]);
    const bad = await pdctl(['room', 'has spaces', '--url', s.url]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/neither a room id nor a request id/);
  });

  it('pdctl engines drain says so in refusals and readiness, and undrain takes the engine back', async () => {
    const drained = await pdctl(['engines', 'drain', 'decode-0', '--url', s.url]);
    expect(drained.code, drained.stderr).toBe(0);
    await waitFor('not ready while decode-0 drains', async () => {
      const r = await get('/health/ready');
      return (
        r.status === 503 &&
        /0 taking rooms .*1 draining/.test(
          (r.body.checks as Record<string, { detail: string }>).decode_engines?.detail ?? '',
        )
      );
    });
    const refused = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'drained', max_tokens: 2 }),
    });
    expect(refused.status).toBe(503);
    expect(refused.headers.get('retry-after')).toBe('5');
    expect(
      ((await refused.json()) as { error: { message: string; code: string } }).error,
    ).toMatchObject({
      code: 'engines_draining',
      message: 'no decode engine takes new requests now (every one is draining); retry later',
    });
    // The client is told what a client can do; the operator's hint is in the log, on the
    // refusal's one line (its access line, at warn).
    await waitFor('the refusal logged with the operator hint', () => {
      const lines = s
        .stderr()
        .split('\n')
        .filter((l) => l.includes('"code":"engines_draining"'));
      return (
        lines.length === 1 &&
        lines[0]?.includes('"level":40') === true &&
        lines[0].includes('"msg":"http"') &&
        lines[0].includes('`pdctl engines undrain decode-0` takes one back')
      );
    });
    const back = await pdctl(['engines', 'undrain', 'decode-0', '--url', s.url]);
    expect(back.code, back.stderr).toBe(0);
    expect(back.stdout).toMatch(/undrain sent to decode-0: it takes new rooms again/);
    await waitFor('ready again', async () => (await get('/health/ready')).status === 200);
    const served = await client.completions.create({ model: MODEL, prompt: 'back', max_tokens: 2 });
    expect(served.choices[0]?.finish_reason).toBe('length');
  });

  it('refuses penalties the built-in model cannot honour, naming the parameter', async () => {
    const res = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'x', max_tokens: 2, frequency_penalty: 0.5 }),
    });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: unknown }).error).toMatchObject({
      param: 'frequency_penalty',
      code: 'unsupported_parameter',
      message: expect.stringMatching(/needs a model that samples/),
    });
    // Zero is what OpenAI clients send by default: accepted.
    const zero = await client.completions.create({
      model: MODEL,
      prompt: 'x',
      max_tokens: 2,
      frequency_penalty: 0,
      presence_penalty: 0,
    });
    expect(zero.choices[0]?.finish_reason).toBe('length');
  });

  it('is ready with the background canary off (--canary-interval-ms 0), and says so', async () => {
    await waitFor(
      'ready',
      async () => (await fetch(`${s.url}/health/ready`)).status === 200,
      15_000,
    );
    const ready = await get('/health/ready');
    expect(ready.body).toMatchObject({
      status: 'ready',
      checks: { canary: { ok: true, detail: expect.stringMatching(/^background canary off/) } },
    });
  });

  it('pdctl journal tail --url prints and follows a running stack’s journal', async () => {
    const made = await client.completions.create({ model: MODEL, prompt: 'tailed', max_tokens: 2 });
    const room = made.id.slice('cmpl-'.length);
    const last = await pdctl(['journal', 'tail', '--url', s.url, '--room', room, '--json']);
    expect(last.code, last.stderr).toBe(0);
    const events = last.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { type: string; room: string });
    // The same events, in the same order, as the journal file holds for the room.
    const fromFile = await pdctl([
      'journal',
      'tail',
      '--journal',
      `${s.dataDir}/journal.db`,
      '--room',
      room,
      '--json',
    ]);
    expect(fromFile.stdout).toBe(last.stdout);
    expect(events[0]?.type).toBe('room.created');
    expect(events.at(-1)?.room).toBe(room);
    // Read as a person reads it: the transfer's line names the first token the client was sent
    // (protocol 9: drawn by the prefill engine).
    const first = ` ${made.choices[0]?.text.trim().split(' ')[0]}`;
    const moved = await pdctl([
      'journal',
      'tail',
      '--url',
      s.url,
      '--room',
      room,
      '--type',
      'room.transfer_completed',
    ]);
    expect(moved.code, moved.stderr).toBe(0);
    expect(moved.stdout).toMatch(
      /room\.transfer_completed .* B in .*, checksum [0-9a-f]+, first token /,
    );
    expect(moved.stdout).toContain(`first token ${JSON.stringify(first)}`);
    expect((await pdctl(['journal', 'tail', '--url', s.url, '--type', 'room.nope'])).code).toBe(2);

    // --follow: a room completed after it started is printed as it is committed.
    const child = spawnPdctl([
      'journal',
      'tail',
      '--url',
      s.url,
      '--follow',
      '--type',
      'room.completed',
      '-n',
      '1',
    ]);
    let out = '';
    let err = '';
    child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
    await waitFor('tail to say it follows', () => err.includes('following'), 15_000);
    const next = await client.completions.create({ model: MODEL, prompt: 'live', max_tokens: 2 });
    const nextRoom = next.id.slice('cmpl-'.length);
    await waitFor(`tail to print ${nextRoom}`, () => out.includes(nextRoom), 10_000);
    expect(out).toMatch(new RegExp(`room\\.completed\\s+${nextRoom}`));
    const code = await new Promise<number | null>((resolve) => {
      child.once('exit', (c) => resolve(c));
      child.kill('SIGINT');
    });
    expect(code).toBe(0);
  });

  it('a second serve on a taken bus port exits 2 with one line that says what to do', async () => {
    const bus = /bus (tcp:\/\/\S+)/.exec(s.stderr())?.[1] as string;
    expect(bus).toMatch(/^tcp:\/\/127\.0\.0\.1:\d+$/);
    const r = await pdctl([
      'serve',
      '--bus',
      bus,
      '--port',
      '0',
      '--data-dir',
      tempDir('pdctl-serve-2-'),
      '--prefill',
      '0',
      '--decode',
      '0',
    ]);
    expect(r.code).toBe(2);
    // One line, a JSON record as the rest of the stream is (stderr is no terminal here).
    const lines = r.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0] as string)).toMatchObject({
      level: 50,
      name: 'serve',
      msg: `pdctl: cannot bind the bus on ${bus}: Address already in use; pass another --bus endpoint (tcp://127.0.0.1:0 takes any free port, for engines that serve starts itself)`,
    });
  });

  it('a second serve on a taken HTTP port exits 2 before it opens the journal or starts an engine', async () => {
    const port = Number(new URL(s.url).port);
    const dataDir = tempDir('pdctl-serve-3-');
    const r = await pdctl([
      'serve',
      '--port',
      String(port),
      '--bus',
      'tcp://127.0.0.1:0',
      '--data-dir',
      dataDir,
    ]);
    expect(r.code).toBe(2);
    const lines = r.stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0] as string)).toMatchObject({
      level: 50,
      msg: expect.stringMatching(
        new RegExp(
          `^pdctl: cannot listen on 127\\.0\\.0\\.1:${port}: .*EADDRINUSE.*; pass another --port$`,
        ),
      ),
    });
    expect(existsSync(join(dataDir, 'journal.db'))).toBe(false);
  });

  it('answers the query routes from the journal, and serves Prometheus metrics', async () => {
    const rooms = await get('/v1/rooms?state=completed&limit=5');
    expect(rooms.status).toBe(200);
    expect((rooms.body.rooms as unknown[]).length).toBeGreaterThan(0);
    expect((await get('/v1/rooms?state=stuck')).status).toBe(400);
    const badOrigin = await get('/v1/rooms?origin=a%20b');
    expect(badOrigin.status).toBe(400);
    expect(badOrigin.body).toMatchObject({ error: { param: 'origin' } });
    expect((await get('/v1/rooms/r-nope')).status).toBe(404);
    const nd = await (await fetch(`${s.url}/v1/journal?type=room.completed&limit=3`)).text();
    const lines = nd
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { type: string });
    expect(lines.length).toBeGreaterThan(0);
    expect(lines.every((l) => l.type === 'room.completed')).toBe(true);
    // follow=1 keeps streaming: a completion made now shows up live.
    const ac = new AbortController();
    const follow = await fetch(`${s.url}/v1/journal?type=room.completed&follow=1&limit=1`, {
      signal: ac.signal,
    });
    const reader = (follow.body as ReadableStream<Uint8Array>).getReader();
    const made = await client.completions.create({
      model: MODEL,
      prompt: 'followed live',
      max_tokens: 2,
    });
    const room = made.id.slice('cmpl-'.length);
    let seen = '';
    while (!seen.includes(room)) seen += new TextDecoder().decode((await reader.read()).value);
    ac.abort();
    const engines = (await get('/v1/engines')).body.engines as Array<{
      role: string;
      totalPages: number;
      kvDevice: number | null;
    }>;
    expect(engines.map((e) => e.role).sort()).toEqual(['decode', 'prefill']);
    expect(engines.map((e) => e.kvDevice)).toEqual([null, null]);
    // `pdctl engines` reads the same view, with each engine's place on the escalation ladder.
    const table = await pdctl(['engines', '--url', s.url]);
    expect(table.code, table.stderr).toBe(0);
    expect(table.stdout).toMatch(/^ENGINE\s+ROLE\s+STATUS\s+STATE\s+PID/);
    expect(table.stdout).toMatch(
      /\nprefill-0\s+prefill\s+live\s+ready\s+\d+\s+\d+ms\s+\d+\s+\d+\/\d+\s+host\s+h-[0-9a-f]{6}\s+shm:\d+\s+\d+\s+ok\s+0\s+0/,
    );
    const json = JSON.parse((await pdctl(['engines', '--url', s.url, '--json'])).stdout) as Array<{
      id: string;
      recovery: { phase: string };
    }>;
    expect(json.map((e) => [e.id, e.recovery.phase]).sort()).toEqual([
      ['decode-0', 'ok'],
      ['prefill-0', 'ok'],
    ]);
    // A port nothing listens on (it was free a moment ago).
    const port = await new Promise<number>((resolve) => {
      const srv = createServer().listen(0, '127.0.0.1', () => {
        const p = (srv.address() as { port: number }).port;
        srv.close(() => resolve(p));
      });
    });
    const down = await pdctl(['engines', '--url', `http://127.0.0.1:${port}`]);
    expect(down.code).toBe(4);
    expect(down.stderr).toMatch(
      /cannot reach .*\/v1\/engines: fetch failed \(ECONNREFUSED\)\. Is pdctl serve running there\? Pass --url\./,
    );
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    for (const line of metrics.split('\n').filter((l) => l.length > 0)) {
      expect(line).toMatch(
        /^(# (HELP|TYPE) \w+ .+|[a-zA-Z_:][\w:]*(\{[^}]*\})? [-+]?([0-9.eE+-]+|NaN|Inf))$/,
      );
    }
    expect(metrics).toMatch(/pdctl_rooms_ended_total\{state="completed",reason="length"\} \d+/);
    expect(metrics).toMatch(/pdctl_state_seconds_bucket\{le="[^"]+",state="transferring"\} \d+/);
    for (const stage of ['bootstrap', 'prefill', 'transfer', 'decode']) {
      expect(metrics).toMatch(new RegExp(`pdctl_stage_seconds_count\\{stage="${stage}"\\} [1-9]`));
    }
    expect(metrics).toMatch(
      /pdctl_engine_heartbeat_age_seconds\{engine="decode-0",role="decode"\}/,
    );
    // The ladder's view: every engine ok, nothing reset or restarted, nothing stalled.
    expect(metrics).toMatch(/pdctl_engine_ladder\{engine="prefill-0",phase="ok"\} 1/);
    expect(metrics).toMatch(
      /pdctl_engine_ladder_actions_total\{engine="decode-0",action="reset_in_place"\} 0/,
    );
    // Read by a real Prometheus text parser, and named by Prometheus's conventions.
    const families = new Map(parsePrometheus(metrics).map((f) => [f.name, f]));
    for (const f of families.values()) {
      expect(f.name).not.toMatch(/^pdctl_process_process_/);
      // prom-client's own process and Node.js series keep prom-client's names (one gauge among
      // them, nodejs_active_resources_total, ends in _total).
      if (/^pdctl_(process|nodejs)_/.test(f.name)) continue;
      if (f.type === 'COUNTER') expect(f.name, f.name).toMatch(/_total$/);
      else expect(f.name, `${f.name} is a ${f.type}`).not.toMatch(/_total$/);
    }
    const value = (name: string, labels: Record<string, string> = {}) =>
      Number(
        families
          .get(name)
          ?.metrics.find((m) => Object.entries(labels).every(([k, v]) => m.labels?.[k] === v))
          ?.value ?? Number.NaN,
      );
    for (const name of [
      'pdctl_journal_append_seconds',
      'pdctl_time_to_first_token_seconds',
      'pdctl_inter_token_latency_seconds',
      'pdctl_stage_seconds',
    ])
      expect(families.get(name)?.type, name).toBe('HISTOGRAM');
    expect(value('pdctl_journal_commits_total')).toBeGreaterThan(0);
    expect(value('pdctl_prompt_tokens_total')).toBeGreaterThan(0);
    expect(value('pdctl_generation_tokens_total')).toBeGreaterThan(0);
    expect(value('pdctl_engine_pages', { engine: 'decode-0' })).toBe(4096);
    expect(value('pdctl_engine_free_pages', { engine: 'decode-0' })).toBeLessThanOrEqual(4096);
    expect(
      value('pdctl_engine_loop_ticks_total', { engine: 'prefill-0', loop: 'bus' }),
    ).toBeGreaterThan(0);
    expect(value('pdctl_engine_queue_depth', { engine: 'decode-0', queue: 'decoding' })).toBe(0);
    expect(value('pdctl_model_info', { model: MODEL })).toBe(1);
    expect(
      value('pdctl_http_responses_total', { route: '/v1/completions', status: '200' }),
    ).toBeGreaterThan(0);
    expect(
      value('pdctl_http_responses_total', { route: '/v1/completions', status: '400' }),
    ).toBeGreaterThan(0);
    expect(families.has('pdctl_process_cpu_seconds_total')).toBe(true);
    expect(metrics).not.toMatch(/pdctl_engine_stalled\{/);
    const docs = await get('/docs/json');
    expect(Object.keys(docs.body.paths as object)).toContain('/v1/chat/completions');
    // Swagger UI, served from the package (no network), at /docs.
    const ui = await fetch(`${s.url}/docs/`);
    expect(ui.status).toBe(200);
    expect(ui.headers.get('content-type')).toMatch(/text\/html/);
    expect(await ui.text()).toMatch(/swagger-ui/i);
  });
});

describe('SIGTERM drains: the listener stays for requests in flight, new ones get 503', () => {
  it('finishes a short stream, cuts a long one at the drain deadline with an error event, journals it aborted (shutdown)', async () => {
    const t = await serve([
      '--decode-us-per-token',
      '20000',
      '--canary-interval-ms',
      '0',
      '--drain-timeout-ms',
      '1500',
    ]);
    const stream = (maxTokens: number) =>
      fetch(`${t.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: MODEL,
          prompt: 'drain me',
          max_tokens: maxTokens,
          stream: true,
        }),
      });
    const long = await stream(1000);
    const short = await stream(30);
    const longRoom = long.headers.get('x-pdctl-room') as string;
    const shortRoom = short.headers.get('x-pdctl-room') as string;
    const longText = long.text();
    const shortText = short.text();
    await new Promise((r) => setTimeout(r, 100));
    const exited = new Promise<number | null>((r) => t.child.once('exit', (code) => r(code)));
    t.child.kill('SIGTERM');
    // Still listening: not ready, and a new request is refused with Retry-After.
    await waitFor('not ready', async () => (await fetch(`${t.url}/health/ready`)).status === 503);
    const ready = (await (await fetch(`${t.url}/health/ready`)).json()) as {
      checks: Record<string, { ok: boolean; detail: string }>;
    };
    expect(ready.checks.serving).toMatchObject({
      ok: false,
      detail: expect.stringMatching(/^shutting down for \d+ s: \d requests in flight finish/),
    });
    const refused = await fetch(`${t.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL, prompt: 'too late', max_tokens: 2 }),
    });
    expect(refused.status).toBe(503);
    expect(refused.headers.get('retry-after')).toBe('1');
    expect(((await refused.json()) as { error: { code: string } }).error.code).toBe(
      'shutting_down',
    );
    // The short stream finishes as usual; the long one ends with an error event, then [DONE].
    expect(await shortText).toMatch(/"finish_reason":"length".*\n\ndata: \[DONE\]\n\n$/s);
    const events = (await longText).split('\n\n').filter((e) => e.startsWith('data: '));
    expect(events.at(-1)).toBe('data: [DONE]');
    expect(JSON.parse((events.at(-2) as string).slice(6))).toMatchObject({
      error: { code: 'shutdown', message: expect.stringMatching(/^pdctl is shutting down/) },
    });
    expect(await exited).toBe(0);
    const journal = `${t.dataDir}/journal.db`;
    const rooms = await pdctl(['rooms', '--journal', journal, '--json']);
    const byId = new Map(
      (
        JSON.parse(rooms.stdout) as {
          rooms: Array<{ room: string; state: string; reason: string }>;
        }
      ).rooms.map((r) => [r.room, r]),
    );
    expect(byId.get(longRoom)).toMatchObject({ state: 'aborted', reason: 'shutdown' });
    expect(byId.get(shortRoom)).toMatchObject({ state: 'completed' });
  }, 60_000);
});
