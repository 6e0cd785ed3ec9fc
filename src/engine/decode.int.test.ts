/**
 * A decode engine on the path of protocol 7: it claims exactly the pages the control plane
 * reserved in `room.created` (or fails the room with the reason an operator can act on), and on
 * the `kv_arrived` hint computes the first token but lets nothing out until the transfer commits.
 * The engine runs in this process with a real shared-memory pool and the built-in model; only the
 * bus is replaced by a recorder of what the engine appends and streams (the control plane's side
 * is tested in control/ and end to end).
 */
import { afterEach, describe, expect, it } from 'vitest';
import type { AppendAck } from '../bus/client.ts';
import type { EngineMessage, EngineMessage as Msg } from '../bus/protocol.ts';
import { silentLogger } from '../log.ts';
import { DeterministicModel, generateInProcess } from '../model/deterministic.ts';
import { type FirstToken, pagesFor } from '../model/executor.ts';
import { KvPool } from '../transfer/pool.ts';
import { DecodeEngine } from './decode.ts';
import { roomKv } from './kv-pages.ts';
import { resolveEngineOptions } from './options.ts';

const INCARNATION = 'inc-1';
const PAGES = 16;
const pools: KvPool[] = [];
afterEach(() => {
  for (const p of pools.splice(0)) {
    p.close();
    KvPool.unlink(p.name);
  }
});

type Appended = EngineMessage<'append'>['event'];
/** What the prefill engine's `room.transfer_completed` says of the KV it computed. */
type Prefilled = { checksum: string; firstToken: FirstToken };

function engine(model = new DeterministicModel()) {
  const opts = resolveEngineOptions({
    id: 'd0',
    role: 'decode',
    control: 'ipc:///nowhere',
    pages: PAGES,
    pageBytes: 4096,
  });
  const pool = KvPool.create({
    name: `/pdctl-test-reserve-${process.pid}-${pools.length}`,
    pages: PAGES,
    pageBytes: 4096,
    replace: true,
  });
  pools.push(pool);
  const appended: Appended[] = [];
  const streamed: Array<Msg<'tokens'>> = [];
  let seq = 0;
  const ports = {
    append: async (eventId: string, event: Appended): Promise<AppendAck> => {
      appended.push(event);
      return {
        eventId,
        status: 'applied',
        original: null,
        seq: 1000 + appended.length,
        reason: null,
        detail: null,
      };
    },
    tokens: (t: Msg<'tokens'>) => {
      streamed.push(t);
    },
    resync: () => {},
  };
  const core = new DecodeEngine({
    opts,
    ports,
    model,
    log: silentLogger,
    pool,
    incarnation: INCARNATION,
  });
  core.onWelcome({
    protocol: 6,
    engine: 'd0',
    incarnation: INCARNATION,
    session: 1,
    replayFrom: 0,
    replayEvents: 0,
    heartbeatMs: 250,
  });
  /** The pages a room of `promptTokens` and `maxTokens` takes in this pool. */
  const need = (promptTokens: number, maxTokens: number) =>
    pagesFor(model.kv, 4096, promptTokens + (model.kv.decodeGrows ? maxTokens : 0));
  /** Delivers a committed event, as the control plane does. */
  const deliver = (
    type: string,
    room: string,
    engine: string | null,
    data: object,
    request?: object,
  ) => {
    seq++;
    core.onEvent({
      prevSeq: seq - 1,
      event: { seq, ts: Date.now(), type, room, engine, source: 't', eventId: `e${seq}`, data },
      ...(request ? { request } : {}),
    } as never as Parameters<DecodeEngine['onEvent']>[0]);
  };
  const created = (
    room: string,
    reservation?: Record<string, unknown>,
    o: { band?: 'interactive' | 'batch'; maxTokens?: number } = {},
  ) =>
    deliver(
      'room.created',
      room,
      null,
      {
        prefillEngine: 'p0',
        decodeEngine: 'd0',
        promptTokens: PROMPT.length,
        maxTokens: o.maxTokens ?? 8,
        ...(reservation ? { reservation: { decode: reservation } } : {}),
        ...(o.band ? { tenant: `t-${o.band}`, band: o.band } : {}),
      },
      { prompt: PROMPT_TEXT, maxTokens: o.maxTokens ?? 8 },
    );
  /** What the prefill engine does: the prompt's KV computed into the room's decode pages. */
  const prefillInto = async (pages: number[]) => {
    const sent = pages.slice(0, pagesFor(model.kv, 4096, PROMPT.length));
    const kv = roomKv(pool, sent, 'empty');
    const done = await model.prefill(PROMPT, kv.pages, async () => true);
    if (!done) throw new Error('prefill stopped');
    kv.store();
    return { checksum: pool.checksumPages(sent), firstToken: done.first };
  };
  /** The prefill engine's transfer committed, with the checksum and the first token it computed. */
  const transferCompleted = (room: string, prefilled: Prefilled) => {
    deliver('room.prefill_started', room, 'p0', {});
    deliver('room.transfer_posted', room, 'p0', { pairs: 1 });
    deliver('room.transfer_completed', room, 'p0', { bytes: 4096, micros: 1, ...prefilled });
  };
  /** The prefill engine released the room: nothing can write into its decode pages any more. */
  const prefillReleased = (room: string) => deliver('room.released', room, 'p0', { pages: 1 });
  const reserved = (pages: number[], o: Record<string, unknown> = {}) => ({
    pages,
    pool: pool.name,
    epoch: pool.epoch,
    incarnation: INCARNATION,
    ...o,
  });
  const of = (room: string) => appended.filter((e) => e.room === room);
  return {
    core,
    deliver,
    appended,
    streamed,
    created,
    prefillInto,
    transferCompleted,
    prefillReleased,
    reserved,
    need,
    of,
    pool,
  };
}

const range = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
const PROMPT_TEXT = 'the quiet harbor at night keeps its lights on for the late boats';
const PROMPT = new DeterministicModel().contextTokens({ prompt: PROMPT_TEXT });
const settle = () => new Promise((r) => setTimeout(r, 50));

describe('a decode engine given a reservation', () => {
  it('holds exactly the reserved pages and names them in room.bootstrapped', async () => {
    const e = engine();
    const n = e.need(PROMPT.length, 8);
    expect(n).toBeGreaterThan(0);
    e.created('r1', e.reserved(range(PAGES - n, n)));
    await Promise.resolve();
    expect(e.of('r1').map((x) => x.type)).toEqual(['room.bootstrap_started', 'room.bootstrapped']);
    expect(e.of('r1')[1]?.data).toEqual({
      pages: range(PAGES - n, n),
      pool: e.pool.name,
      epoch: e.pool.epoch,
    });
    expect(e.core.allocator.pagesOf('r1')).toEqual(range(PAGES - n, n));
    // A room without a reservation (protocol 5's way) gets the engine's own choice, around them.
    e.created('r2');
    expect(e.of('r2')[1]?.data).toMatchObject({ pages: range(0, n) });
    expect(e.core.freePages()).toBe(PAGES - 2 * n);
  });

  it('refuses pages it holds, pages outside the pool, another pool or epoch, another count: kv_reservation_refused, nothing held', async () => {
    const e = engine();
    const n = e.need(PROMPT.length, 8);
    e.created('held', e.reserved(range(0, n)));
    const bad: Array<[string, ReturnType<typeof e.reserved>]> = [
      ['r-taken', e.reserved(range(0, n))],
      ['r-outside', e.reserved(range(PAGES - n + 1, n))],
      ['r-pool', e.reserved(range(n, n), { pool: '/pdctl-other' })],
      ['r-epoch', e.reserved(range(n, n), { epoch: e.pool.epoch + 1 })],
      ['r-count', e.reserved(range(n, n + 1))],
    ];
    for (const [room, r] of bad) e.created(room, r);
    await new Promise((r) => setImmediate(r));
    for (const [room] of bad) {
      // It releases the room only once the prefill engine has: from room.created on, that engine
      // may be writing into the reserved pages (protocol 7, rule 7).
      expect(e.of(room).some((x) => x.type === 'room.released')).toBe(false);
      e.prefillReleased(room);
      const failed = e.of(room).find((x) => x.type === 'room.failed');
      expect(failed?.data, room).toMatchObject({
        reason: 'kv_reservation_refused',
        stage: 'bootstrapping',
      });
      expect(e.of(room).find((x) => x.type === 'room.released')?.data, room).toEqual({ pages: 0 });
      expect(
        e.of(room).some((x) => x.type === 'room.bootstrapped'),
        room,
      ).toBe(false);
    }
    expect(e.core.allocator.rooms()).toEqual(['held']);
    expect(e.core.freePages()).toBe(PAGES - n);
  });

  it('fails a room reserved in the pool of an earlier process as engine_restarted, before bootstrapping', () => {
    const e = engine();
    e.created('r1', e.reserved([0], { incarnation: 'inc-0' }));
    e.prefillReleased('r1');
    expect(e.of('r1').map((x) => [x.type, x.data])).toEqual([
      ['room.failed', { reason: 'engine_restarted', stage: 'created', detectedBy: 'engine:d0' }],
      ['room.released', { pages: 0 }],
    ]);
    expect(e.core.freePages()).toBe(PAGES);
  });
});

describe('a decode engine told the KV arrived before the transfer commits', () => {
  const started = (e: ReturnType<typeof engine>, room: string) =>
    e.of(room).some((x) => x.type === 'room.decode_started');

  /** Room r1 reserved, its KV computed into its pages, and the hint sent (naming `hint` as its checksum, if given). */
  async function hinted(hint?: string) {
    const e = engine();
    const pages = range(0, e.need(PROMPT.length, 8));
    e.created('r1', e.reserved(pages));
    const prefilled = await e.prefillInto(pages);
    e.core.onKvArrived({
      room: 'r1',
      bytes: 4096,
      ...prefilled,
      checksum: hint ?? prefilled.checksum,
    });
    await settle();
    return { e, pages, prefilled };
  }

  /** Its own events commit; it releases the room, and says nothing was thrown away. */
  function expectCleanRelease(e: ReturnType<typeof engine>, pages: number[]): void {
    e.deliver('room.decode_started', 'r1', 'd0', {});
    e.deliver('room.completed', 'r1', 'd0', { tokens: 8, finishReason: 'length' });
    expect(e.of('r1').find((x) => x.type === 'room.released')?.data).toEqual({
      pages: pages.length,
    });
  }

  it('computes the first token on the hint, holds it, and lets it out once the transfer commits', async () => {
    const { e, pages, prefilled } = await hinted();
    expect(started(e, 'r1')).toBe(false);
    expect(e.streamed).toEqual([]);
    // Held, it waits on the commit, not on the work loop: a heartbeat says nothing is queued, so a
    // prefill engine that froze before its append does not make this engine look stuck.
    expect(e.core.queueDepths()).toEqual({ decoding: 0 });
    e.transferCompleted('r1', prefilled);
    await settle();
    expect(started(e, 'r1')).toBe(true);
    const completed = e.of('r1').find((x) => x.type === 'room.completed');
    expect(completed?.data).toMatchObject({ tokens: 8 });
    // After the prefill's first token (chunk 0), the same text as a room decoded without the hint.
    expect(e.streamed[0]?.index).toBe(1);
    const text = (prefilled.firstToken?.text ?? '') + e.streamed.map((t) => t.text).join('');
    expect(text).toBe(generateInProcess(new DeterministicModel(), PROMPT_TEXT, 8).text);
    expectCleanRelease(e, pages);
  });

  it('throws the first token away when the room ends before the commit, and says so on its release', async () => {
    const { e, pages } = await hinted();
    // An abort committed before the transfer: the room ends aborted.
    e.deliver('room.aborted', 'r1', null, { reason: 'client_disconnect', source: 'client' });
    e.prefillReleased('r1');
    expect(e.streamed).toEqual([]);
    expect(started(e, 'r1')).toBe(false);
    expect(e.of('r1').find((x) => x.type === 'room.released')?.data).toEqual({
      pages: pages.length,
      speculativeTokens: 1,
    });
  });

  it('ignores a hint whose checksum the pages do not match: the committed event decides', async () => {
    const { e, pages, prefilled } = await hinted('not-the-checksum');
    e.transferCompleted('r1', prefilled);
    await settle();
    expect(e.of('r1').find((x) => x.type === 'room.completed')?.data).toMatchObject({ tokens: 8 });
    expectCleanRelease(e, pages);
  });
});

describe('a decode engine on a model whose steps run one after another', () => {
  it('steps an interactive room alone until its first chunk: a batch room waits, then goes on', async () => {
    // The device takes 5 ms a step; each step's room is logged as it is asked for.
    const asked: string[] = [];
    const model = new DeterministicModel({ decodeCompute: 'device', decodeUsPerToken: 5000 });
    const start = model.startDecode.bind(model);
    let rooms = 0;
    model.startDecode = async (
      tokens: readonly number[],
      first: FirstToken,
      pages: readonly Uint8Array[],
    ) => {
      const stream = await start(tokens, first, pages);
      // The batch room starts decoding first.
      const label = rooms++ === 0 ? 'batch' : 'interactive';
      const next = stream.next.bind(stream);
      return {
        ...stream,
        next: () => {
          asked.push(label);
          return next();
        },
      };
    };
    const e = engine(model);
    const per = e.need(PROMPT.length, 32);
    expect(2 * per).toBeLessThanOrEqual(PAGES);
    const batchPages = range(0, per);
    e.created('b1', e.reserved(batchPages), { band: 'batch', maxTokens: 32 });
    e.transferCompleted('b1', await e.prefillInto(batchPages));
    await settle();
    const interactivePages = range(per, per);
    e.created('i1', e.reserved(interactivePages), { band: 'interactive', maxTokens: 8 });
    const from = asked.length;
    e.transferCompleted('i1', await e.prefillInto(interactivePages));
    // Until the batch room has stepped again after the interactive one's first chunk (5 s at most).
    const resumed = () => {
      const a = asked.slice(from);
      const i = a.indexOf('interactive');
      return i >= 0 && a.slice(i + 4).includes('batch');
    };
    for (let waited = 0; !resumed() && waited < 5000; waited += 20)
      await new Promise((r) => setTimeout(r, 20));
    const after = asked.slice(from);
    const firstChunk = after.indexOf('interactive') + 4;
    // Its first chunk's four steps with no batch step between them (one already asked may run).
    expect(after.slice(after.indexOf('interactive'), firstChunk)).toEqual(
      Array(4).fill('interactive'),
    );
    // And the batch room went on afterwards.
    expect(after.slice(firstChunk)).toContain('batch');
  });
});
