import fc from 'fast-check';
import { encode } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import {
  controlFrames,
  encodeBatch,
  encodePayload,
  engineFrames,
  PROTOCOL_VERSION,
} from './protocol.ts';

const seed = Number(process.env.FC_SEED ?? Date.now() % 2 ** 31);

const hello = {
  protocol: PROTOCOL_VERSION,
  engine: 'decode-0',
  role: 'decode',
  incarnation: 'i-1',
  pid: 10,
  pages: 8,
  pageBytes: 4096,
  pool: '/pdctl-decode-0',
  epoch: 5,
  lastSeq: 0,
  rooms: [],
};

describe('frame decoder', () => {
  const engine = engineFrames(1024);

  it('accepts a valid message of each kind and returns its payload', () => {
    const msgs = {
      hello,
      heartbeat: {
        ticks: { bus: 1 },
        queues: {},
        freePages: 8,
        rooms: 0,
        lastSeq: 3,
        state: 'ready',
      },
      append: {
        eventId: 'e-1',
        session: 1,
        n: 1,
        event: { type: 'room.released', room: 'r-1', data: { pages: 2 } },
      },
      tokens: { room: 'r-1', index: 0, text: ' river', tokens: 1 },
    };
    for (const [kind, payload] of Object.entries(msgs)) {
      const d = engine.decode([Buffer.from(kind), encodePayload(payload)]);
      expect(d, kind).toEqual({ ok: true, kind, payload });
    }
  });

  it('names what is wrong with a bad frame instead of throwing', () => {
    expect(engine.decode([Buffer.from('ABORT')])).toMatchObject({
      ok: false,
      reason: 'bad_frame_count',
    });
    expect(engine.decode([Buffer.from('abort_room'), encode({})])).toMatchObject({
      reason: 'unknown_kind',
    });
    expect(engine.decode([Buffer.from('hello'), Buffer.alloc(2048)])).toMatchObject({
      reason: 'too_large',
    });
    expect(engine.decode([Buffer.from('hello'), encode(hello).subarray(0, 7)])).toMatchObject({
      reason: 'bad_msgpack',
    });
    const d = engine.decode([Buffer.from('hello'), encode({ ...hello, pages: -1 })]);
    expect(d).toMatchObject({ ok: false, reason: 'bad_payload' });
    expect(d.ok ? '' : d.detail).toMatch(/\/pages/);
    expect(engine.decode([Buffer.from('hello'), encode({ ...hello, extra: 1 })])).toMatchObject({
      reason: 'bad_payload',
    });
  });

  it('unpacks a batch into its items, each validated on its own', () => {
    const tokens = { room: 'r-1', index: 0, text: ' a', tokens: 1 };
    const items = engine.decodeAll([
      Buffer.from('batch'),
      encodeBatch([
        ['tokens', encodePayload(tokens)],
        ['tokens', encodePayload({ ...tokens, index: -1 })],
        ['batch', encodePayload({ items: [] })],
        ['ABORT', Buffer.alloc(0)],
      ]),
    ]);
    expect(items.map((d) => (d.ok ? d.kind : d.reason))).toEqual([
      'tokens',
      'bad_payload',
      'bad_payload',
      'unknown_kind',
    ]);
    expect(engine.decodeAll([Buffer.from('batch'), encode({ items: 3 })])).toMatchObject([
      { ok: false, reason: 'bad_payload', kind: 'batch' },
    ]);
  });

  it(`never throws on arbitrary frames (seed ${seed})`, () => {
    const kinds = fc.constantFrom('hello', 'heartbeat', 'append', 'tokens', 'event', 'ABORT', '');
    fc.assert(
      fc.property(
        fc.array(
          fc.oneof(
            kinds.map((k) => Buffer.from(k)),
            fc.uint8Array({ maxLength: 64 }).map(Buffer.from),
          ),
          {
            maxLength: 4,
          },
        ),
        fc.anything(),
        (frames, value) => {
          for (const decoder of [engine, controlFrames(1024)]) {
            decoder.decodeAll(frames);
            decoder.decodeAll([frames[0] ?? Buffer.alloc(0), encodePayload(value)]);
            decoder.decodeAll([
              Buffer.from('batch'),
              encodePayload({ items: [['hello', encodePayload(value)]] }),
            ]);
          }
        },
      ),
      { seed, numRuns: 2000 },
    );
  });

  it(`round-trips every valid tokens message (seed ${seed})`, () => {
    fc.assert(
      fc.property(
        fc.record({
          room: fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,40}$/),
          index: fc.nat(),
          text: fc.string({ maxLength: 200 }),
          tokens: fc.nat(),
        }),
        (msg) => {
          expect(engine.decode([Buffer.from('tokens'), encodePayload(msg)])).toEqual({
            ok: true,
            kind: 'tokens',
            payload: msg,
          });
        },
      ),
      { seed, numRuns: 500 },
    );
  });
});
