/**
 * The API's operator routes and admission control, on a real stack through fastify's inject():
 * the bearer token, abort, engine commands, 429 when engines are full, 503 when the journal
 * cannot be written, and the canary's verdict journaled only when it changes.
 */
import { describe, expect, it } from 'vitest';
import { buildApi } from '../src/api/app.ts';
import { ApiMetrics } from '../src/api/metrics.ts';
import type { Stack } from '../src/app/stack.ts';
import { Canary } from '../src/control/evidence/canary.ts';
import { type Logger, silentLogger } from '../src/log.ts';
import { committed, fillJournal, sqliteFaults, startTestStack, waitFor } from './helpers/stack.ts';

async function api(
  stack: Stack,
  opts: {
    adminToken?: string | null;
    log?: Logger;
    admissionWaitMs?: number;
  } = {},
) {
  const canary = new Canary(stack.control, silentLogger, 2000);
  const metrics = new ApiMetrics(stack.control, stack.recovery);
  const app = await buildApi({
    control: stack.control,
    journal: stack.journal,
    recovery: stack.recovery,
    canary,
    metrics,
    log: opts.log ?? silentLogger,
    version: 'test',
    adminToken: opts.adminToken ?? null,
    admissionWaitMs: opts.admissionWaitMs,
    retention: stack.retention,
  });
  return { app, canary, metrics };
}

const completion = (extra: Record<string, unknown> = {}) => ({
  method: 'POST' as const,
  url: '/v1/completions',
  payload: {
    model: 'pdctl-deterministic-1',
    prompt: 'the harbor at night',
    max_tokens: 8,
    ...extra,
  },
});

describe('operator routes and admission', () => {
  it("echoes the client's x-request-id, journals it with its traceparent, and logs every answer", async () => {
    const stack = await startTestStack();
    const lines: Array<Record<string, unknown>> = [];
    const log: Logger = { ...silentLogger, info: (obj, msg) => lines.push({ ...obj, msg }) };
    const { app } = await api(stack, { log });
    // A scraper's and a load balancer's probes that succeed are no info lines.
    for (const url of ['/metrics', '/health'])
      expect((await app.inject({ url })).statusCode).toBe(200);
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    const res = await app.inject({
      ...completion(),
      headers: { 'x-request-id': 'incident-42', traceparent },
    });
    expect(res.statusCode).toBe(200);
    expect(res.headers['x-request-id']).toBe('incident-42');
    const room = res.headers['x-pdctl-room'] as string;
    const created = (await stack.control.journal.timeline(room)).events[0];
    expect(created?.data).toMatchObject({ requestId: 'incident-42', traceparent });
    // Without one (or with one that is not usable), a fresh id; a refused request has one too,
    // and a traceparent that is not one is left out.
    const refused = await app.inject({
      ...completion({ max_tokens: 0 }),
      headers: { 'x-request-id': 'has spaces', traceparent: '00-zz-00-01' },
    });
    expect(refused.statusCode).toBe(400);
    expect(refused.headers['x-request-id']).toMatch(/^[0-9a-f-]{36}$/);
    const again = await app.inject(completion());
    const made = again.headers['x-request-id'] as string;
    expect(made).toMatch(/^[0-9a-f-]{36}$/);
    const plain = (await stack.control.journal.timeline(again.headers['x-pdctl-room'] as string))
      .events[0];
    expect(plain?.data).toMatchObject({ requestId: made });
    expect(plain?.data).not.toHaveProperty('traceparent');
    // The access log: one line per answer, with its id, status, time and room.
    await waitFor(
      'three access-log lines',
      () => lines.filter((l) => l.msg === 'http').length >= 3,
    );
    const http = lines.filter((l) => l.msg === 'http');
    expect(http.filter((l) => l.url === '/metrics' || l.url === '/health')).toEqual([]);
    expect(http[0]).toMatchObject({
      requestId: 'incident-42',
      method: 'POST',
      url: '/v1/completions',
      status: 200,
      room,
    });
    expect(http[1]).toMatchObject({ status: 400, room: null });
    expect(typeof http[0]?.ms).toBe('number');
    // Over real HTTP too, where a stream writes its own head: its access line names its room.
    const url = await app.listen({ host: '127.0.0.1', port: 0 });
    try {
      const streamed = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-request-id': 'incident-43' },
        body: JSON.stringify(completion({ stream: true }).payload),
      });
      await streamed.text();
      const plainHttp = await fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-request-id': 'incident-44' },
        body: JSON.stringify(completion().payload),
      });
      await plainHttp.text();
      await waitFor('their access lines', () =>
        lines.some((l) => l.msg === 'http' && l.requestId === 'incident-44'),
      );
      for (const [rid, res] of [
        ['incident-43', streamed],
        ['incident-44', plainHttp],
      ] as const)
        expect(lines.find((l) => l.msg === 'http' && l.requestId === rid)).toMatchObject({
          status: 200,
          room: res.headers.get('x-pdctl-room'),
        });
    } finally {
      await app.close();
    }
  });

  it('an operator abort ends a stream with finish_reason "abort", the text so far, and why', async () => {
    const stack = await startTestStack({ engineArgs: ['--decode-us-per-token', '5000'] });
    const { app } = await api(stack, { adminToken: null });
    const pending = app.inject(completion({ max_tokens: 400, stream: true }));
    await waitFor('a room decoding with tokens out', () =>
      [...stack.control.liveRooms()].some((r) => r.state === 'decoding'),
    );
    const room = [...stack.control.liveRooms()].find((r) => r.state === 'decoding')?.room as string;
    await new Promise((r) => setTimeout(r, 100));
    const ok = await app.inject({
      method: 'POST',
      url: `/v1/rooms/${room}/abort`,
      payload: { reason: 'operator_test' },
    });
    expect(ok.statusCode).toBe(202);
    const res = await pending;
    expect(res.statusCode).toBe(200);
    const events = res.body
      .split('\n\n')
      .filter((e) => e.startsWith('data: '))
      .map((e) => e.slice(6));
    expect(events.at(-1)).toBe('[DONE]');
    const last = JSON.parse(events.at(-2) as string) as Record<string, unknown> & {
      choices: Array<{ finish_reason: string }>;
    };
    expect(last.choices[0]?.finish_reason).toBe('abort');
    expect(last).toMatchObject({ pdctl_room: room, pdctl_abort_reason: 'operator_test' });
    expect(res.body).not.toContain('"error"');
    // Some text came before the abort.
    expect(events.length).toBeGreaterThan(3);
  });

  it('guards abort and commands with the bearer token, and aborts a live room, on a log line of its own', async () => {
    const stack = await startTestStack({ engineArgs: ['--decode-us-per-token', '5000'] });
    const lines: Array<Record<string, unknown>> = [];
    const log: Logger = { ...silentLogger, info: (obj, msg) => lines.push({ ...obj, msg }) };
    const { app } = await api(stack, { adminToken: 's3cret', log });
    const pending = app.inject(completion({ max_tokens: 400 }));
    await waitFor('a room decoding', () =>
      [...stack.control.liveRooms()].some((r) => r.state === 'decoding'),
    );
    const room = [...stack.control.liveRooms()].find((r) => r.state === 'decoding')?.room as string;
    expect((await app.inject({ method: 'POST', url: `/v1/rooms/${room}/abort` })).statusCode).toBe(
      401,
    );
    const wrong = await app.inject({
      method: 'POST',
      url: `/v1/rooms/${room}/abort`,
      headers: { authorization: 'Bearer nope' },
    });
    expect(wrong.json()).toMatchObject({ error: { type: 'authentication_error' } });
    const auth = { authorization: 'Bearer s3cret' };
    const ok = await app.inject({
      method: 'POST',
      url: `/v1/rooms/${room}/abort`,
      headers: auth,
      payload: { reason: 'operator_test' },
    });
    expect(ok.statusCode).toBe(202);
    // The operator's abort says itself at 3 a.m.: the room, why, and its call's access line
    // names the room too.
    expect(lines).toContainEqual(
      expect.objectContaining({
        msg: 'operator abort: room.abort_requested journaled',
        room,
        reason: 'operator_test',
      }),
    );
    expect(lines).toContainEqual(
      expect.objectContaining({ msg: 'http', url: `/v1/rooms/${room}/abort`, status: 202, room }),
    );
    const res = await pending;
    expect(res.statusCode).toBe(409);
    expect(res.json()).toMatchObject({ error: { code: 'room_aborted' } });
    await waitFor(
      'aborted',
      async () => (await stack.control.journal.timeline(room)).room?.state === 'aborted',
    );
    expect(
      (await app.inject({ method: 'POST', url: `/v1/rooms/${room}/abort`, headers: auth }))
        .statusCode,
    ).toBe(409);
    // An id that names no room and no request: refused, and nothing journaled under it (a
    // rejection record there once made `pdctl room r-none` show a room that never was).
    const head = await stack.control.journal.headSeq();
    for (const none of ['r-none', 'oc-abort-2']) {
      const refused = await app.inject({
        method: 'POST',
        url: `/v1/rooms/${none}/abort`,
        headers: auth,
      });
      expect(refused.statusCode).toBe(404);
      expect(refused.json().error.message).toBe(
        `no room and no request ${none} in the journal (nothing was journaled)`,
      );
      expect((await stack.control.journal.timeline(none)).events).toEqual([]);
    }
    expect(
      (await stack.control.journal.tail({ afterSeq: head, type: 'room.event_rejected' })).length,
    ).toBe(0);
    // A prune of rooms that may still await their engines' releases (the aborted one, say) is
    // refused by default, as serve --retain refuses such a horizon; nothing is pruned.
    const prune = await app.inject({
      method: 'POST',
      url: '/v1/admin/journal/prune',
      headers: auth,
      payload: { olderThan: '1m' },
    });
    expect(prune.statusCode).toBe(400);
    expect(prune.json().error.message).toMatch(/^olderThan 1m is shorter than 5m: /);
    expect((await stack.control.journal.timeline(room)).room?.state).toBe('aborted');
    // A request id aborts the request's live room.
    const byRequest = app.inject({
      ...completion({ max_tokens: 400 }),
      headers: { 'x-request-id': 'oc-abort-3' },
    });
    await waitFor('its room decoding', async () => {
      const [r] = (await stack.control.journal.rooms({ requestId: 'oc-abort-3', limit: 1 })).rooms;
      return r?.state === 'decoding';
    });
    const byId = await app.inject({
      method: 'POST',
      url: '/v1/rooms/oc-abort-3/abort',
      headers: auth,
    });
    expect(byId.statusCode, byId.body).toBe(202);
    const [its] = (await stack.control.journal.rooms({ requestId: 'oc-abort-3', limit: 1 })).rooms;
    expect(byId.json()).toMatchObject({
      requestId: 'oc-abort-3',
      room: its?.room,
      rooms: [{ room: its?.room, status: 'applied' }],
    });
    expect((await byRequest).json()).toMatchObject({ error: { code: 'room_aborted' } });
    await waitFor(
      'its room aborted',
      async () =>
        (await stack.control.journal.timeline(its?.room as string)).room?.state === 'aborted',
    );
    const again = await app.inject({
      method: 'POST',
      url: '/v1/rooms/oc-abort-3/abort',
      headers: auth,
    });
    expect(again.statusCode).toBe(409);
    expect(again.json().error.message).toBe(
      `request oc-abort-3's rooms have ended: ${its?.room} aborted`,
    );
    const cmd = await app.inject({
      method: 'POST',
      url: '/v1/admin/engines/prefill-0/commands',
      headers: auth,
      payload: { command: 'reset_transfer', reason: 'test' },
    });
    expect(cmd.statusCode).toBe(202);
    expect(
      (await stack.control.journal.tail({ type: 'recovery.action', limit: 5 }))[0]?.data,
    ).toMatchObject({ action: 'reset_transfer', outcome: 'sent' });
    const noToken = await app.inject({
      method: 'POST',
      url: '/v1/admin/engines/prefill-0/commands',
      payload: { command: 'drain' },
    });
    expect(noToken.statusCode).toBe(401);
    const unknown = await app.inject({
      method: 'POST',
      url: '/v1/admin/engines/nobody/commands',
      headers: auth,
      payload: { command: 'drain' },
    });
    expect(unknown.statusCode).toBe(404);
    await app.close();
  });

  it('when every decode engine is full a request waits its turn, on the record; with x-pdctl-queue-ttl-ms: 0 it is 429 at once; 503 when the journal cannot be written', async () => {
    const stack = await startTestStack({
      engineArgs: ['--decode-us-per-token', '5000'],
      maxRoomsPerEngine: 2,
    });
    const { app } = await api(stack);
    const first = [
      app.inject(completion({ max_tokens: 100 })),
      app.inject(completion({ max_tokens: 100 })),
    ];
    await waitFor('two rooms live', () => (stack.control.engine('decode-0')?.liveRooms ?? 0) >= 2);
    const ttl = (v: string, id?: string) => ({
      ...completion(),
      headers: { 'x-pdctl-queue-ttl-ms': v, ...(id ? { 'x-request-id': id } : {}) },
    });
    const full = await app.inject(ttl('0'));
    expect(full.statusCode).toBe(429);
    expect(full.headers['retry-after']).toBe('1');
    expect(full.json()).toMatchObject({ error: { type: 'rate_limit_error', code: 'overloaded' } });
    const bad = await app.inject(ttl('soon'));
    expect(bad.statusCode).toBe(400);
    expect(bad.json().error).toMatchObject({
      code: 'invalid_parameter',
      param: 'x-pdctl-queue-ttl-ms',
    });
    // Without the header it waits for one of the two rooms to end (about 0.5 s), then is served.
    const waited = await app.inject(ttl('10000', 'waited-1'));
    expect(waited.statusCode, waited.body).toBe(200);
    for (const r of await Promise.all(first)) expect(r.statusCode).toBe(200);
    const created = await committed(stack.journal, {
      type: 'room.created',
      room: waited.headers['x-pdctl-room'] as string,
    });
    expect(created.data.waitedMs).toBeGreaterThan(0);
    // Its own wait (on a loaded machine one of the first two may have waited a millisecond too).
    const ofWaited = async () =>
      (await stack.journal.tail({ type: 'request.waited', limit: 20 })).filter((e) =>
        e.data.requestIds.includes('waited-1'),
      );
    await waitFor('the wait journaled', async () => (await ofWaited()).length === 1);
    const [wait] = await ofWaited();
    expect(wait?.data).toMatchObject({
      reason: 'overloaded',
      count: 1,
      requestIds: ['waited-1'],
      waitedMs: created.data.waitedMs,
      maxWaitedMs: created.data.waitedMs,
    });

    // A journal that cannot grow (a full disk) fails commits; the API then refuses new work.
    const journal = stack.journal;
    await fillJournal(journal);
    expect(journal.health().writable).toBe(false);
    const rooms = (await journal.stats()).rooms;
    const again = await app.inject(completion());
    expect(again.statusCode).toBe(503);
    expect(again.json()).toMatchObject({ error: { code: 'journal_unavailable' } });
    expect((await journal.stats()).rooms).toBe(rooms);
    await sqliteFaults(stack.journal).limitPages(null);
    // Both refusals are on the record: the 503's once the journal takes writes again.
    await waitFor(
      'the refusals journaled',
      async () => Object.keys((await journal.stats()).refusalsByReason).length === 2,
      10_000,
    );
    expect((await journal.stats()).refusalsByReason).toEqual({
      overloaded: 1,
      journal_unavailable: 1,
    });
    const [refused] = await journal.tail({ type: 'request.refused', limit: 10 });
    expect(refused?.data).toMatchObject({
      status: 429,
      count: 1,
      requestIds: [full.headers['x-request-id']],
    });
    await app.close();
  });

  it('a request that finds no decode engine waits for its restart; past the wait it is refused, journaled and counted', async () => {
    const stack = await startTestStack();
    const { app } = await api(stack, { admissionWaitMs: 10_000 });
    const decodeGone = () =>
      !stack.control.engines().some((e) => e.role === 'decode' && e.takesRooms);
    expect(stack.engines.signal('decode-0', 'SIGKILL')).toBe(true);
    await waitFor('decode-0 gone', decodeGone);
    const waited = await app.inject(completion());
    expect(waited.statusCode, waited.body).toBe(200);

    // Past the wait: refused, with how long it waited, and on the record.
    const { app: brief, metrics } = await api(stack, { admissionWaitMs: 300 });
    const restarts = stack.engines.restarts('decode-0');
    await stack.engines.stop();
    await waitFor('decode-0 gone again', decodeGone);
    const ids = ['late-1', 'late-2', 'late-3'];
    for (const id of ids) {
      const res = await brief.inject({ ...completion(), headers: { 'x-request-id': id } });
      expect(res.statusCode).toBe(503);
      // An engine restart takes about 2 s: the client is told when to try again.
      expect(res.headers['retry-after']).toBe('2');
      expect(res.json().error).toMatchObject({
        code: 'no_engines',
        message: expect.stringMatching(/\(waited 300 ms for one\)$/),
      });
    }
    await waitFor(
      'three refusals journaled',
      async () => (await stack.journal.stats()).refusalsByReason.no_engines === 3,
    );
    const events = await stack.journal.tail({ type: 'request.refused', limit: 10 });
    expect(events.flatMap((e) => e.data.requestIds as string[])).toEqual(ids);
    // A refused id leads to its refusal, not to "nothing matches".
    const byRequest = await brief.inject({ method: 'GET', url: '/v1/rooms?request_id=late-2' });
    expect(byRequest.json()).toMatchObject({
      rooms: [],
      refusals: [{ type: 'request.refused', data: { reason: 'no_engines', status: 503 } }],
    });
    const lines = (await brief.inject({ method: 'GET', url: '/v1/journal?request_id=late-2' })).body
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { type: string; data: { requestIds: string[] } });
    // Refusals within a second share an event: one or more, each listing late-2.
    expect(lines.length).toBeGreaterThan(0);
    for (const e of lines) {
      expect(e.type).toBe('request.refused');
      expect(e.data.requestIds).toContain('late-2');
    }
    expect(
      (await brief.inject({ method: 'GET', url: '/v1/rooms?request_id=never-sent' })).json(),
    ).toEqual({ rooms: [], nextCursor: null, refusals: [] });
    // A burst: every refused id leads to its refusal, not only the first 20 of a second (ids 45
    // and 60 of a burst of 60 were once not found), 20 ids to an event.
    const burst = Array.from({ length: 60 }, (_, i) => `burst-${i + 1}`);
    await Promise.all(
      burst.map((id) => brief.inject({ ...completion(), headers: { 'x-request-id': id } })),
    );
    await waitFor(
      'the burst journaled',
      async () => (await stack.journal.stats()).refusalsByReason.no_engines === 63,
    );
    const written = await stack.journal.tail({ type: 'request.refused', limit: 100 });
    const idsOf = (e: (typeof written)[number]) => e.data.requestIds as string[];
    expect(written.flatMap(idsOf).sort()).toEqual([...ids, ...burst].sort());
    for (const e of written) {
      expect(idsOf(e).length).toBeLessThanOrEqual(20);
      expect(e.data.count).toBe(idsOf(e).length);
    }
    for (const id of burst) {
      const found = (
        await brief.inject({ method: 'GET', url: `/v1/rooms?request_id=${id}` })
      ).json() as { refusals: Array<{ data: { requestIds: string[] } }> };
      expect(
        found.refusals.map((e) => e.data.requestIds.includes(id)),
        id,
      ).toEqual([true]);
    }
    expect(restarts).toBe(1);
    expect(await metrics.text()).toMatch(
      /^pdctl_requests_refused_total\{reason="no_engines"\} 63$/m,
    );
    await app.close();
    await brief.close();
  });

  it('journals the canary verdict only when it changes', async () => {
    const stack = await startTestStack();
    const { canary } = await api(stack);
    for (let i = 0; i < 3; i++) expect((await canary.run()).ok).toBe(true);
    // The prefill engine starts on room.created (protocol 7): a frozen decode engine holds the
    // canary where decode owns it, with its KV transferred.
    stack.engines.signal('decode-0', 'SIGSTOP');
    const stuck = await canary.run(1000);
    expect(stuck).toMatchObject({ ok: false, stage: 'decode' });
    stack.engines.signal('decode-0', 'SIGCONT');
    await waitFor('canary ok again', async () => (await canary.run()).ok);
    // The verdict is journaled after the run returns: wait for the third.
    const verdicts = async () =>
      (
        await stack.control.journal.tail({
          type: 'canary.changed',
          limit: 10,
          order: 'oldest',
          afterSeq: 0,
        })
      ).map((e) => e.data.ok);
    await waitFor('the recovery journaled', async () => (await verdicts()).length >= 3);
    expect(await verdicts()).toEqual([true, false, true]);
  });
});
