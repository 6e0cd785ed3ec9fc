/**
 * The room book as a specification: given committed events (and admissions), when one more
 * thing happens, then this is what the book holds — which rooms count on which engine, what pages
 * are promised, whose stream ends, what an engine may append next. No bus, no journal, no
 * processes: the same events the journal would commit, folded by the one reducer.
 */
import { describe, expect, it } from 'vitest';
import { engineSession } from '../../../test/helpers/engine-session.ts';
import type { RoomRequest } from '../../bus/protocol.ts';
import { systemClock } from '../../ports/clock.ts';
import type { JournalEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import type { EngineAppend, EngineAppendType } from '../engines/engine-appends.ts';
import type { EngineSession } from '../engines/engine-session.ts';
import { RoomEndedError, RoomStream } from '../intake/streams.ts';
import { RoomBook } from './room-book.ts';

/** Engines whose hellos say how their KV takes pages: 1 page per 4 tokens (16 B a token, 64 B pages). */
const kv: EngineSession['kv'] = { baseBytes: 0, bytesPerToken: 16, decodeGrows: true };
const ENGINES = ['p0', 'd0', 'd1'];

/** A fresh fleet per book: pages promised are written into the sessions. */
function fleet(): (id: string) => EngineSession {
  const all = new Map(
    ENGINES.map((id) => [
      id,
      engineSession(id, id.startsWith('p') ? 'prefill' : 'decode', { kv, pageBytes: 64 }),
    ]),
  );
  return (id) => all.get(id) as EngineSession;
}

let seq = 0;
function ev(
  type: JournalEvent['type'],
  room: string,
  data: Record<string, unknown> = {},
  engine: string | null = null,
): JournalEvent {
  seq++;
  const envelope = { seq, ts: 1_000_000 + seq, room, engine, source: 'test', eventId: `e${seq}` };
  return { ...envelope, type, data } as JournalEvent;
}

const created = (room: string, decode = 'd0') =>
  ev('room.created', room, { prefillEngine: 'p0', decodeEngine: decode, promptTokens: 8 });
/** The events that take a room from created to decoding, as its engines append them. */
const toDecoding = (room: string, decode = 'd0') => [
  created(room, decode),
  ev('room.bootstrap_started', room, {}, decode),
  ev('room.bootstrapped', room, { pages: [1, 2] }, decode),
  ev('room.prefill_started', room, {}, 'p0'),
  ev('room.transfer_posted', room, {}, 'p0'),
  ev('room.transfer_completed', room, { bytes: 128, micros: 10, checksum: 'x' }, 'p0'),
  ev('room.decode_started', room, {}, decode),
];
const released = (room: string, engine: string) => ev('room.released', room, {}, engine);

const request: RoomRequest = { prompt: 'the river', maxTokens: 8 };

/** A book after `given` (admissions and committed events, in order), and a stream per admission. */
function given(...steps: Array<JournalEvent | { admit: string; decode?: string }>) {
  const session = fleet();
  const book = new RoomBook(session);
  const streams = new Map<string, RoomStream>();
  for (const s of steps) {
    if ('admit' in s) {
      const stream = new RoomStream(s.admit, 8, 0);
      streams.set(s.admit, stream);
      book.admit(s.admit, {
        stream,
        request,
        promptTokens: 8,
        prefill: session('p0'),
        decode: session(s.decode ?? 'd0'),
      });
    } else book.fold(s);
  }
  const each = (f: (e: string) => number) => Object.fromEntries(ENGINES.map((e) => [e, f(e)]));
  return {
    book,
    session,
    streams,
    /** Rooms not yet ended per engine. */
    counts: () => each((e) => book.liveOn(e)),
    /** Pages promised per engine. */
    pages: () => each((e) => session(e).load.reservedPages),
  };
}

/** An append past the bus's checks; the book reads only its type and room. */
const append = (type: EngineAppendType, room: string) => ({ type, room, data: {} }) as EngineAppend;

describe('RoomBook: admission', () => {
  it('an admitted room counts on both engines and promises their pages before it commits', () => {
    const { book, counts, pages } = given({ admit: 'r1' });
    expect(counts()).toEqual({ p0: 1, d0: 1, d1: 0 });
    // p0 holds the prompt (8 tokens: 2 pages); d0 also every token it may generate (16: 4 pages).
    expect(pages()).toEqual({ p0: 2, d0: 4, d1: 0 });
    expect(book.request('r1')).toEqual(request);
    expect(book.room('r1')).toBeUndefined();
    expect(book.owners('r1')).toBeUndefined();
  });

  it('its room.created committing counts it once per engine, not twice', () => {
    const { book, counts } = given({ admit: 'r1' }, created('r1'));
    expect(counts()).toEqual({ p0: 1, d0: 1, d1: 0 });
    expect(book.owners('r1')).toMatchObject({ prefillEngine: 'p0', decodeEngine: 'd0' });
  });

  it('a room.created the journal refused takes the room out: no count, no pages, its stream back', () => {
    const { book, streams, counts, pages } = given({ admit: 'r1' });
    const stream = book.abandon('r1', { prefillEngine: 'p0', decodeEngine: 'd0' });
    expect(stream).toBe(streams.get('r1'));
    expect(counts()).toEqual({ p0: 0, d0: 0, d1: 0 });
    expect(pages()).toEqual({ p0: 0, d0: 0, d1: 0 });
    expect(book.request('r1')).toBeUndefined();
    expect(book.stream('r1')).toBeUndefined();
  });

  it('a room another control plane created (no admission here) still counts on its engines', () => {
    const { counts, book } = given(created('r1', 'd1'));
    expect(counts()).toEqual({ p0: 1, d0: 0, d1: 1 });
    expect(book.stream('r1')).toBeUndefined();
  });
});

describe('RoomBook: a room ends', () => {
  it('completed: its stream is handed over to end, its count goes, its pages go as each engine releases', async () => {
    const { book, streams, counts, pages } = given({ admit: 'r1' }, ...toDecoding('r1'));
    const stream = streams.get('r1') as RoomStream;
    stream.push({ room: 'r1', index: 0, text: ' a b', tokens: 2 });
    const done = book.fold(ev('room.completed', 'r1', { tokens: 2, finishReason: 'stop' }, 'd0'));
    expect(done?.ended?.stream).toBe(stream);
    expect(done?.ended?.stream?.endAs(done.room)).toBeNull();
    expect((await stream.result).finishReason).toBe('stop');
    expect(counts()).toEqual({ p0: 0, d0: 0, d1: 0 });
    expect(book.request('r1')).toBeUndefined();
    // Ended, but in the book until both engines release it: their pages are still in use.
    expect(book.room('r1')?.state).toBe('completed');
    expect(pages()).toEqual({ p0: 2, d0: 4, d1: 0 });
    book.fold(released('r1', 'p0'));
    expect(pages()).toEqual({ p0: 0, d0: 4, d1: 0 });
    book.fold(released('r1', 'd0'));
    expect(pages()).toEqual({ p0: 0, d0: 0, d1: 0 });
    expect(book.room('r1')).toBeUndefined();
    // Late events from its engines are still theirs.
    expect(book.owners('r1')).toEqual({ prefillEngine: 'p0', decodeEngine: 'd0' });
  });

  it('completed with tokens missing from the stream: the client gets an error, not a short answer', async () => {
    const { book, streams } = given({ admit: 'r1' }, ...toDecoding('r1'));
    const done = book.fold(ev('room.completed', 'r1', { tokens: 5, finishReason: 'length' }, 'd0'));
    expect(done?.ended?.stream?.endAs(done.room)).toBe('stream is missing 5 tokens');
    await expect(streams.get('r1')?.result).rejects.toBeInstanceOf(RoomEndedError);
  });

  it('remembers the engines of a bounded number of ended rooms', () => {
    const book = new RoomBook(fleet(), systemClock, 2);
    for (const r of ['a', 'b', 'c']) {
      book.fold(created(r));
      book.fold(ev('room.failed', r, { reason: 'x', stage: 'created', detectedBy: 'control' }));
      book.fold(released(r, 'p0'));
      book.fold(released(r, 'd0'));
    }
    expect([book.owners('a'), book.owners('b'), book.owners('c')].map(Boolean)).toEqual([
      false,
      true,
      true,
    ]);
  });
});

describe('RoomBook: abort', () => {
  it('an abort request keeps the room live until room.aborted commits; then it ends as aborted', async () => {
    const { book, streams, counts } = given({ admit: 'r1' }, ...toDecoding('r1'));
    const asked = book.fold(ev('room.abort_requested', 'r1', { reason: 'client_disconnect' }));
    expect(asked?.ended).toBeNull();
    expect(asked?.room.abortRequestedAt).not.toBeNull();
    book.fold(released('r1', 'p0'));
    book.fold(released('r1', 'd0'));
    expect(counts()).toEqual({ p0: 1, d0: 1, d1: 0 });
    const aborted = book.fold(
      ev('room.aborted', 'r1', { reason: 'client_disconnect', source: 'client' }),
    ) as NonNullable<ReturnType<RoomBook['fold']>>;
    aborted.ended?.stream?.endAs(aborted.room);
    await expect(streams.get('r1')?.result).rejects.toMatchObject({
      state: 'aborted',
      reason: 'client_disconnect',
    });
    // Released by both before it ended: it leaves the book at once.
    expect(counts()).toEqual({ p0: 0, d0: 0, d1: 0 });
    expect(book.room('r1')).toBeUndefined();
  });
});

describe('RoomBook: migration', () => {
  it('a stream taken out before room.migrated commits is not ended with the old room', () => {
    const { book, session, streams, counts } = given({ admit: 'r1' }, ...toDecoding('r1'));
    const stream = book.takeStream('r1');
    expect(stream).toBe(streams.get('r1'));
    const moved = book.fold(
      ev('room.migrated', 'r1', { toRoom: 'r2', reason: 'engine_lost', tokens: 0 }),
    );
    expect(moved?.ended).toMatchObject({ stream: undefined });
    expect(stream?.done).toBe(false);
    // It cannot go back to a room that ended; it goes on in the continuation's admission.
    expect(book.returnStream('r1', stream as RoomStream)).toBe(false);
    book.admit('r2', {
      stream: stream as RoomStream,
      request,
      promptTokens: 8,
      prefill: session('p0'),
      decode: session('d1'),
    });
    expect(book.stream('r2')).toBe(stream);
    expect(counts()).toEqual({ p0: 1, d0: 0, d1: 1 });
  });

  it('a migration the journal did not take gives the stream back to the room, still live', () => {
    const { book, streams } = given({ admit: 'r1' }, ...toDecoding('r1'));
    const stream = book.takeStream('r1') as RoomStream;
    expect(book.returnStream('r1', stream)).toBe(true);
    expect(book.stream('r1')).toBe(streams.get('r1'));
  });
});

describe('RoomBook: reconciling engine appends', () => {
  it('judges an append after those of the same room still on their way to a commit', () => {
    const { book } = given(
      created('r1'),
      ev('room.bootstrap_started', 'r1', {}, 'd0'),
      ev('room.bootstrapped', 'r1', { pages: [1] }, 'd0'),
    );
    // The prefill engine sends prefill_started and transfer_posted back to back.
    expect(book.project(append('room.prefill_started', 'r1'), 'p0', 'e')).toBe(true);
    expect(book.project(append('room.transfer_posted', 'r1'), 'p0', 'e')).toBe(true);
    // One the committed room plus those in flight cannot take is refused: a second post, a
    // completion of a room not decoding, an event from an engine not its own.
    expect(book.project(append('room.transfer_posted', 'r1'), 'p0', 'e')).toBe(false);
    expect(book.project(append('room.completed', 'r1'), 'd0', 'e')).toBe(false);
    expect(book.project(append('room.transfer_completed', 'r1'), 'd1', 'e')).toBe(false);
    // Once both settled without committing (the journal refused them), the committed room judges again.
    book.settled('r1');
    book.settled('r1');
    expect(book.project(append('room.transfer_posted', 'r1'), 'p0', 'e')).toBe(false);
    expect(book.project(append('room.prefill_started', 'r1'), 'p0', 'e')).toBe(true);
  });

  it('knows nothing to append to for a room it never had', () => {
    const { book } = given();
    expect(book.project(append('room.prefill_started', 'nope'), 'p0', 'e')).toBe(false);
    expect(book.owners('nope')).toBeUndefined();
  });

  it('rooms loaded at start count on their engines until their failure folds', async () => {
    const room = (r: string, state: Room['state']) =>
      ({
        room: r,
        state,
        prefillEngine: 'p0',
        decodeEngine: 'd1',
        releasedBy: [],
      }) as unknown as Room;
    const book = new RoomBook(fleet());
    // A journal with nothing of their pages (the page map's part of the load: page-map.unit.test.ts).
    const noEvents = { tail: async () => [] };
    await book.load(noEvents, [room('o1', 'decoding'), room('o2', 'created')], 0);
    expect([book.liveOn('p0'), book.liveOn('d1')]).toEqual([2, 2]);
    const failed = book.fold(
      ev('room.failed', 'o1', {
        reason: 'orphaned_by_restart',
        stage: 'decoding',
        detectedBy: 'control',
      }),
    );
    expect(failed?.ended).toEqual({ stream: undefined });
    expect([book.liveOn('p0'), book.liveOn('d1')]).toEqual([1, 1]);
  });
});
