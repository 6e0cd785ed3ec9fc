/**
 * The API keeps what its OpenAPI document (`/docs/json`) promises: every route's real answer, on a
 * stack started by the composition root, validates against the response schema the document
 * publishes for that route and status. A field renamed in code but not in the schema fails here.
 */
import { join } from 'node:path';
import { Ajv } from 'ajv';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Serving, startServing } from '../src/app/serving.ts';
import { pruneCommand } from '../src/cli/journal/prune.ts';
import { silentLogger } from '../src/log.ts';
import type { WindowSummary } from '../src/planner/record.ts';
import { pdctl } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';

let serving: Serving;
let base: string;
let doc: { paths: Record<string, Record<string, { responses: Record<string, unknown> }>> };
const ajv = new Ajv({ strict: false, allErrors: true });

beforeAll(async () => {
  serving = await startServing({
    journalPath: join(tempDir('pdctl-schemas-'), 'journal.db'),
    durability: 'process',
    log: silentLogger,
    version: 'test',
    engineLogLevel: 'error',
    canaryIntervalMs: 0,
    planner: { mode: 'advise', intervalMs: 1000 },
    // A pass may take rooms that ended 300 ms ago here (by default, only 5 minutes ago).
    api: { adminToken: null, pruneFloorMs: 300 },
  });
  base = await serving.listen('127.0.0.1', 0);
  doc = (await (await fetch(`${base}/docs/json`)).json()) as typeof doc;
  ajv.addSchema(doc, 'openapi');
}, 60_000);
afterAll(() => serving?.close());

/** The JSON schema the document gives for `route` (as fastify names it) answering `status`. */
function schemaFor(method: string, route: string, status: number): object {
  const path = route.replace(/:(\w+)/g, '{$1}');
  const responses = doc.paths[path]?.[method.toLowerCase()]?.responses;
  expect(responses, `${method} ${path} is in the document`).toBeDefined();
  const key = String(status) in (responses ?? {}) ? String(status) : `${String(status)[0]}XX`;
  expect(responses?.[key], `${method} ${path} documents ${status}`).toBeDefined();
  const pointer = [
    'paths',
    path,
    method.toLowerCase(),
    'responses',
    key,
    'content',
    'application/json',
    'schema',
  ]
    .map((p) => p.replaceAll('~', '~0').replaceAll('/', '~1'))
    .join('/');
  return { $ref: `openapi#/${pointer}` };
}

/** Calls the route and checks its answer against the document. */
async function check(
  method: string,
  route: string,
  url: string,
  body?: unknown,
): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(`${base}${url}`, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const json = (await res.json()) as Record<string, unknown>;
  const valid = ajv.validate(schemaFor(method, route, res.status), json);
  expect(
    valid,
    `${method} ${url} → ${res.status}: ${ajv.errorsText()}\n${JSON.stringify(json).slice(0, 400)}`,
  ).toBe(true);
  return { status: res.status, json };
}

describe('every answer matches the OpenAPI document', () => {
  it('serving routes: models, completions, chat, and their errors', async () => {
    const model = serving.stack.control.modelInfo.name;
    expect((await check('GET', '/v1/models', '/v1/models')).status).toBe(200);
    const done = await check('POST', '/v1/completions', '/v1/completions', {
      model,
      prompt: 'the harbor at night',
      max_tokens: 6,
    });
    expect(done.status).toBe(200);
    const chat = await check('POST', '/v1/chat/completions', '/v1/chat/completions', {
      model,
      messages: [{ role: 'user', content: 'a lantern' }],
      max_tokens: 4,
      stop: [' river'],
    });
    expect(chat.status).toBe(200);
    const bad = await check('POST', '/v1/completions', '/v1/completions', {
      model,
      prompt: 'x',
      max_tokens: '16',
    });
    expect(bad.status).toBe(400);
    const unknown = await check('POST', '/v1/completions', '/v1/completions', {
      model: 'gpt-none',
      prompt: 'x',
    });
    expect(unknown.status).toBe(404);
    // Over the 1 MiB body limit: the API's own code, and a message that says the limit.
    const huge = await check('POST', '/v1/completions', '/v1/completions', {
      model,
      prompt: 'x'.repeat(1 << 20),
    });
    expect(huge.status).toBe(413);
    expect(huge.json.error).toMatchObject({
      code: 'request_too_large',
      type: 'invalid_request_error',
      message: expect.stringContaining('limit of 1048576 bytes (1 MiB)'),
    });
  });

  it('query routes: rooms, a timeline, engines, stats', async () => {
    const rooms = await check('GET', '/v1/rooms', '/v1/rooms?origin=all&limit=5');
    expect(rooms.status).toBe(200);
    const first = (rooms.json.rooms as Array<{ room: string }>)[0];
    expect(first).toBeDefined();
    expect((await check('GET', '/v1/rooms/:room', `/v1/rooms/${first?.room}`)).status).toBe(200);
    expect((await check('GET', '/v1/rooms/:room', '/v1/rooms/r-nope-000000')).status).toBe(404);
    expect((await check('GET', '/v1/rooms', '/v1/rooms?state=nonsense')).status).toBe(400);
    const engines = await check('GET', '/v1/engines', '/v1/engines');
    expect((engines.json.engines as unknown[]).length).toBe(2);
    expect((await check('GET', '/v1/stats', '/v1/stats')).status).toBe(200);
  });

  it('health routes: alive, ready (either answer), deep canary', async () => {
    expect((await check('GET', '/health', '/health')).status).toBe(200);
    const ready = await check('GET', '/health/ready', '/health/ready');
    expect([200, 503]).toContain(ready.status);
    const deep = await check('GET', '/health/deep', '/health/deep?deadline_ms=5000');
    expect(deep.status).toBe(200);
    expect((await check('GET', '/health/deep', '/health/deep?deadline_ms=1')).status).toBe(400);
  });

  it('operations: a live room, its abort, and an engine command, accepted and refused', async () => {
    const control = serving.stack.control;
    const stream = control.submit({ prompt: 'a long slow song', maxTokens: 2000 });
    await stream.admitted;
    // In flight now: /v1/live counts it and lists it.
    const live = await check('GET', '/v1/live', '/v1/live?limit=5');
    expect(live.json.total).toBeGreaterThanOrEqual(1);
    expect((live.json.rooms as Array<{ room: string }>).map((r) => r.room)).toContain(stream.room);
    expect((await check('GET', '/v1/live', '/v1/live?limit=x')).status).toBe(400);
    const abort = await check('POST', '/v1/rooms/:room/abort', `/v1/rooms/${stream.room}/abort`, {
      reason: 'schema test',
    });
    expect(abort.status).toBe(202);
    await stream.result.catch(() => {});
    const cmd = await check(
      'POST',
      '/v1/admin/engines/:engine/commands',
      '/v1/admin/engines/decode-0/commands',
      { command: 'reset_transfer' },
    );
    expect(cmd.status).toBe(202);
    const missing = await check(
      'POST',
      '/v1/admin/engines/:engine/commands',
      '/v1/admin/engines/decode-9/commands',
      { command: 'drain' },
    );
    expect(missing.status).toBe(404);
  });

  it('an operator cordons an engine and uncordons it: no room for it meanwhile, and both journaled', async () => {
    const { control } = serving.stack;
    const cordon = (engine: string) =>
      check('POST', `/v1/admin/engines/:engine/cordon`, `/v1/admin/engines/${engine}/cordon`, {
        reason: 'inspect its GPU',
      });
    const uncordon = (engine: string) =>
      check('POST', `/v1/admin/engines/:engine/uncordon`, `/v1/admin/engines/${engine}/uncordon`);
    const pid = control.registry.get('prefill-0')?.pid;
    expect((await cordon('prefill-0')).status).toBe(202);
    expect((await cordon('prefill-0')).status).toBe(409);
    expect((await cordon('prefill-9')).status).toBe(404);
    const engines = await check('GET', '/v1/engines', '/v1/engines');
    const p0 = (engines.json.engines as Array<{ id: string; cordon: unknown }>).find(
      (e) => e.id === 'prefill-0',
    );
    expect(p0?.cordon).toMatchObject({ reason: 'inspect its GPU', by: 'operator', evidence: null });
    const ready = (await (await fetch(`${base}/health/ready`)).json()) as {
      checks: Record<string, { ok: boolean; detail: string }>;
    };
    expect(ready.checks.cordoned_engines?.detail).toContain('prefill-0 cordoned by the operator');
    expect(ready.checks.prefill_engines?.ok).toBe(false);
    expect(() => control.submit({ prompt: 'no prefill engine takes it', maxTokens: 2 })).toThrow(
      expect.objectContaining({
        message: 'no prefill engine takes new requests now (every one is cordoned); retry later',
        operatorHint:
          'every prefill engine is cordoned (prefill-0): none takes new rooms; `pdctl engines uncordon prefill-0` takes one back',
      }),
    );
    expect((await uncordon('prefill-0')).status).toBe(202);
    expect((await uncordon('prefill-0')).status).toBe(409);
    const out = control.submit({ prompt: 'taken again', maxTokens: 2 });
    await out.result;
    expect(control.registry.get('prefill-0')?.pid).toBe(pid);
    const journaled = await control.journal.tail({
      type: ['engine.cordoned', 'engine.uncordoned'],
      engine: 'prefill-0',
    });
    expect(journaled.map((e) => [e.type, e.data.by])).toEqual([
      ['engine.cordoned', 'operator'],
      ['engine.uncordoned', 'operator'],
    ]);
  });

  it('an operator prunes the serving journal: a dry run counts, a pass runs in the background, the CLI follows one', async () => {
    await serving.stack.control.submit({ prompt: 'to be pruned', maxTokens: 2 }).result;
    await new Promise((r) => setTimeout(r, 350));
    const route = '/v1/admin/journal/prune';
    const dry = await check('POST', route, route, { olderThan: '1ms', dryRun: true });
    expect(dry.status).toBe(200);
    expect(dry.json.rooms).toBeGreaterThanOrEqual(1);
    const bad = await check('POST', route, route, { olderThan: 'soon' });
    expect(bad.status).toBe(400);
    expect(JSON.stringify(bad.json)).toContain('invalid olderThan');
    const shorter = await check('POST', route, route, { olderThan: '1h', eventsOlderThan: '1m' });
    expect(shorter.status).toBe(400);
    // Rooms that ended too recently may still await their engines' releases: refused, not pruned.
    const early = await check('POST', route, route, { olderThan: '100ms' });
    expect(early.status).toBe(400);
    expect(JSON.stringify(early.json)).toContain('olderThan 100ms is shorter than 300ms');
    const started = await check('POST', route, route, { olderThan: '300ms', chunk: 1 });
    expect(started.status).toBe(202);
    let status = await check('GET', route, route);
    while (status.json.running !== null) {
      await new Promise((r) => setTimeout(r, 20));
      status = await check('GET', route, route);
    }
    const last = status.json.last as { by: string; result: { rooms: number }; error: null };
    expect(last).toMatchObject({ by: 'operator', error: null });
    expect(last.result.rooms).toBe(dry.json.rooms);
    expect(await serving.stack.journal.countPrunable(Date.now())).toMatchObject({ rooms: 0 });
    await serving.stack.control.submit({ prompt: 'and this one', maxTokens: 2 }).result;
    await new Promise((r) => setTimeout(r, 350));
    const code = await pruneCommand({ olderThan: '300ms', url: base, journal: 'unused' });
    expect(code).toBe(0);
    expect(await serving.stack.journal.countPrunable(Date.now())).toMatchObject({ rooms: 0 });
    const pruned = await serving.stack.journal.tail({ type: 'journal.pruned', limit: 5 });
    expect(pruned.length).toBe(2);
  });
  it('the planner: its decisions journaled each interval, on /v1/planner, /metrics and pdctl plan --url', async () => {
    const { control, journal } = serving.stack;
    const mark = await journal.headSeq();
    await Promise.all(
      Array.from(
        { length: 6 },
        (_, i) => control.submit({ prompt: `plan ${i}`, maxTokens: 4 }).result,
      ),
    );
    // The intervals the rooms ran in end within a second or two; their decisions are journaled.
    const decidedSince = async () =>
      await journal.tail({ type: 'planner.decision', afterSeq: mark, limit: 50, order: 'oldest' });
    const completed = async () =>
      (await decidedSince()).reduce(
        (n, e) => n + (e.data.inputs as unknown as WindowSummary).outputTokens.count,
        0,
      );
    const deadline = Date.now() + 10_000;
    while ((await completed()) < 6 && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 100));
    expect(await completed()).toBeGreaterThanOrEqual(6);
    const [decision] = await decidedSince();
    expect(decision?.source).toBe('planner');
    expect(decision?.data).toMatchObject({
      mode: 'advise',
      acted: false,
      fleet: { prefill: 1, decode: 1 },
    });
    const answer = await check('GET', '/v1/planner', '/v1/planner');
    expect(answer.status).toBe(200);
    expect(answer.json).toMatchObject({ mode: 'advise', intervalMs: 1000, config: { budget: 2 } });
    const recent = answer.json.recent as Array<{ seq: number }>;
    expect(recent.length).toBeGreaterThanOrEqual(1);
    expect(recent.map((e) => e.seq)).toEqual([...recent.map((e) => e.seq)].sort((a, b) => b - a));
    const metrics = await (await fetch(`${base}/metrics`)).text();
    const last = answer.json.last as { proposal: { prefill: number; decode: number } };
    expect(metrics).toContain(
      `pdctl_planner_desired_engines{role="prefill"} ${last.proposal.prefill}`,
    );
    expect(metrics).toContain(
      `pdctl_planner_desired_engines{role="decode"} ${last.proposal.decode}`,
    );
    const cli = await pdctl(['plan', '--url', base]);
    expect(cli.code, cli.stderr).toBe(0);
    expect(cli.stdout).toMatch(
      /^planner: advise, every 1 s; budget 2 engines; targets: TTFT p90 ≤ 500 ms/,
    );
    expect(cli.stdout).toMatch(/\nnow: 1 prefill \/ 1 decode; proposes \d \/ \d \(\w+\)/);
    expect(cli.stdout).toMatch(/fleet P\/D +target P\/D +proposal P\/D +reason/);
  });
});
