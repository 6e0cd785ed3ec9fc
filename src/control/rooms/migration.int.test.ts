/**
 * Migration against a real journal: what it journals for a lost engine's rooms, and what the
 * client's stream sees, when a healthy pair is free, when none comes, and past the limit. The
 * rooms are the control plane's own room book, folding every committed event, and new rooms go
 * through its intake; only the bus and the engine processes are absent (the whole-stack
 * migrations, SIGKILLed engines, are in test/engine-restart.e2e.test.ts).
 */

import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { engineSession } from '../../../test/helpers/engine-session.ts';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { SqliteJournal } from '../../journal/sqlite/journal.ts';
import { silentLogger } from '../../log.ts';
import { DeterministicModel } from '../../model/deterministic.ts';
import { systemClock } from '../../ports/clock.ts';
import { systemIds } from '../../ports/ids.ts';
import type { JournalEvent } from '../../room/events.ts';
import { newRoomId } from '../../room/ids.ts';
import type { Room } from '../../room/reducer.ts';
import { DEFAULT_LIVENESS } from '../engines/engine-view.ts';
import { EngineRegistry } from '../engines/registry.ts';
import { ControlError } from '../errors.ts';
import { Intake } from '../intake/intake.ts';
import { RoomStream } from '../intake/streams.ts';
import { Router } from '../routing/router.ts';
import { Migrator } from './migration.ts';
import { RoomBook } from './room-book.ts';

const dir = tempDir('pdctl-migration-');
const journals: SqliteJournal[] = [];
afterEach(async () => {
  for (const j of journals.splice(0)) await j.drain();
});

async function setup(limit = 2, maxRoomsPerEngine = 512) {
  const journal = await SqliteJournal.open({
    path: join(dir, `${newRoomId()}.db`),
    durability: 'process',
  });
  journals.push(journal);
  const registry = new EngineRegistry();
  const book = new RoomBook((engine) => registry.get(engine));
  const events: JournalEvent[] = [];
  // What the control plane does with each commit that concerns migration (control-plane.ts).
  let migrator: Migrator | null = null;
  journal.subscribe(0, (ev) => {
    events.push(ev);
    const f = book.fold(ev);
    if (f?.admittedOn) void migrator?.created(f.room, f.admittedOn);
  });
  const model = new DeterministicModel();
  const intake = new Intake({
    journal,
    registry,
    book,
    model,
    liveness: DEFAULT_LIVENESS,
    maxRoomsPerEngine,
    pairAvoided: () => false,
    pairTaken: () => {},
    router: new Router({ policy: 'least-loaded', blockTokens: 64, overlapWeight: 1 }),
    timed: (p) => p,
    clock: systemClock,
    ids: systemIds,
  });
  migrator = new Migrator(
    {
      journal,
      model,
      log: silentLogger,
      book,
      intake,
      closing: () => false,
      clock: systemClock,
      ids: systemIds,
    },
    { limit, waitMs: 200, retryLimit: 1 },
  );

  /** A room of `the river` created on `p`/`d`: its room.created handed to the journal. */
  const roomOn = (p: string, d: string) => {
    const [prefill, decode] = [registry.get(p), registry.get(d)];
    if (!prefill || !decode) throw new Error(`${p} and ${d} must be registered`);
    const room = newRoomId();
    const stream = new RoomStream(room, 2, Date.now());
    const request = { prompt: 'the river', maxTokens: 8 };
    intake.create(
      stream,
      room,
      request,
      2,
      { prefill, decode, transport: 'shm' },
      { source: 'api' },
    );
    return { room, stream, request };
  };
  /** A live room on p0/d0 that has streamed `text` (words of the model's), its client still reading. */
  const liveRoom = async (text: string) => {
    const { room, stream } = roomOn('p0', 'd0');
    await stream.admitted;
    stream.push({ room, index: 0, text, tokens: 2 });
    return { room, stream };
  };
  /** The continuation rooms journaled, with the request sent along. */
  const created = () =>
    events
      .filter((e) => e.type === 'room.created' && e.source === 'migration')
      .map((e) => ({
        room: e.room as string,
        from: (e.data as { migratedFrom?: string }).migratedFrom,
        prefill: (e.data as { prefillEngine: string }).prefillEngine,
        request: book.request(e.room as string),
      }));
  const typesOf = (room: string) => events.filter((e) => e.room === room).map((e) => e.type);
  return { journal, registry, book, intake, migrator, created, events, roomOn, liveRoom, typesOf };
}

async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('Migrator', () => {
  it('continues a lost engine room on a healthy pair, with the prompt and the text streamed so far', async () => {
    const t = await setup();
    // p0's old incarnation is the lost one; p1 and d0 are healthy.
    t.registry.set(engineSession('p0', 'prefill'));
    t.registry.set(engineSession('p1', 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    const { room, stream } = await t.liveRoom(' stone light');
    expect([t.book.liveOn('p0'), t.book.liveOn('d0')]).toEqual([1, 1]);
    await t.migrator.engineLost('p0', 'p0-a', 'it exited');
    await until(() => t.created().length === 1);
    const [next] = t.created();
    expect(next).toMatchObject({
      from: room,
      prefill: 'p1',
      request: { prompt: 'the river', maxTokens: 6, generated: ' stone light' },
    });
    expect(stream.current).toBe(next?.room);
    expect(stream.migrations).toBe(1);
    await until(() => t.typesOf(room).includes('room.released'));
    expect(t.typesOf(room)).toEqual(['room.created', 'room.migrated', 'room.released']);
    // The old room ended: it counts on no engine; the continuation counts on p1 and d0.
    expect([t.book.liveOn('p0'), t.book.liveOn('p1'), t.book.liveOn('d0')]).toEqual([0, 1, 1]);
    const released = t.events.find((e) => e.room === room && e.type === 'room.released');
    expect(released?.engine).toBe('p0');
  });

  it('moves a room whose room.created was still on its way to the journal when its engine was lost', async () => {
    const t = await setup();
    t.registry.set(engineSession('p0', 'prefill'));
    t.registry.set(engineSession('p1', 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    const { room, stream } = t.roomOn('p0', 'd0');
    // The append is queued, not committed: the lost engine's rooms, as the book shows them now,
    // do not include it.
    expect(t.book.room(room)).toBeUndefined();
    await t.migrator.engineLost('p0', 'p0-a', 'it exited');
    await until(() => t.created().length === 1);
    expect(t.created()[0]).toMatchObject({ from: room, prefill: 'p1' });
    await until(() => t.typesOf(room).includes('room.released'));
    expect(t.typesOf(room)).toEqual(['room.created', 'room.migrated', 'room.released']);
    expect(stream.current).toBe(t.created()[0]?.room);
  });

  it('fails the stream and journals why when no healthy pair comes within the wait', async () => {
    const t = await setup();
    t.registry.set(engineSession('p0', 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    const { room, stream } = await t.liveRoom(' stone light');
    await t.migrator.engineLost('p0', 'p0-a', 'it exited');
    const err = await stream.result.then(
      () => null,
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(ControlError);
    expect((err as ControlError).code).toBe('CONTROL_NO_ENGINES');
    expect(t.created()).toEqual([]);
    await until(() => t.events.some((e) => e.type === 'recovery.action'));
    const action = t.events.find((e) => e.type === 'recovery.action');
    expect(action).toMatchObject({
      room,
      data: {
        action: 'migrate_room',
        outcome: expect.stringMatching(/^failed: no healthy engine pair within 200 ms/),
      },
    });
  });

  it('tries a request again without the engine its room failed on, and migrates it later without that engine too', async () => {
    const t = await setup();
    for (const e of ['p0', 'p1', 'p2']) t.registry.set(engineSession(e, 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    // A room on p1 fails before its first token, by a fault of its pair: tried again without p1
    // (d0 is the only decode engine).
    const { room, stream, request } = t.roomOn('p1', 'd0');
    await stream.admitted;
    await t.journal.append({
      type: 'room.failed',
      room,
      engine: 'd0',
      source: 'engine',
      data: { reason: 'kv_checksum_mismatch', stage: 'created', detectedBy: 'd0' },
    });
    await until(() => t.book.room(room)?.state === 'failed');
    expect(t.migrator.retry(t.book.room(room) as Room, stream, request)).toBe(true);
    const prefillOf = (source: string) =>
      t.events
        .filter((e) => e.type === 'room.created' && e.source === source)
        .map((e) => (e.data as { prefillEngine: string }).prefillEngine);
    await until(() => prefillOf('retry').length === 1);
    const [retriedOn] = prefillOf('retry');
    expect(['p0', 'p2']).toContain(retriedOn);
    // Its engine is lost: the migration goes to the one prefill engine left that the request has
    // not failed on, never back to p1, idle as it is, in either order.
    await t.migrator.engineLost(retriedOn as string, `${retriedOn}-a`, 'it exited');
    await until(() => prefillOf('migration').length === 1);
    expect(prefillOf('migration')).toEqual([retriedOn === 'p0' ? 'p2' : 'p0']);
  });

  it('fails the room instead once the request has used its migrations', async () => {
    const t = await setup(1);
    t.registry.set(engineSession('p0', 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    const { room, stream } = await t.liveRoom(' stone light');
    stream.continueIn(room); // as if it had migrated once already
    await t.migrator.engineLost('d0', 'd0-a', 'it exited');
    await until(() => t.typesOf(room).includes('room.failed'));
    const failed = t.events.find((e) => e.room === room && e.type === 'room.failed');
    expect(failed?.data).toMatchObject({ reason: 'migration_limit_reached', stage: 'created' });
    expect(t.created()).toEqual([]);
  });

  it('moves a retiring engine’s rooms whose prefill has not begun, and leaves those it works on', async () => {
    const t = await setup();
    t.registry.set(engineSession('p0', 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    t.registry.set(engineSession('d1', 'decode'));
    // Both rooms on d0, behind p0's queue; p0 has begun the second one's prefill.
    const queued = t.roomOn('p0', 'd0');
    const begun = t.roomOn('p0', 'd0');
    await Promise.all([queued.stream.admitted, begun.stream.admitted]);
    await t.journal.append({
      type: 'room.prefill_started',
      room: begun.room,
      engine: 'p0',
      source: 'engine',
      data: {},
    });
    await until(() => t.book.room(begun.room)?.state === 'prefilling');
    t.registry.retiring.add('d0');
    expect(await t.migrator.moveQueued('d0')).toBe(1);
    await until(() => t.created().length === 1);
    const [next] = t.created();
    const onto = t.events.find((e) => e.room === next?.room && e.type === 'room.created');
    expect(onto?.data).toMatchObject({ prefillEngine: 'p0', decodeEngine: 'd1' });
    expect(next?.request).toMatchObject({ prompt: 'the river', maxTokens: 8 });
    const migrated = t.events.find((e) => e.room === queued.room && e.type === 'room.migrated');
    expect(migrated?.data).toMatchObject({ toRoom: next?.room, reason: 'engine_retiring' });
    // A planned move is not a migration the request's limit counts.
    expect([queued.stream.current, queued.stream.migrations]).toEqual([next?.room, 0]);
    // d0 is alive and releases the moved room itself: none is journaled for it.
    expect(t.typesOf(queued.room)).toEqual(['room.created', 'room.migrated']);
    expect(t.book.room(begun.room)?.state).toBe('prefilling');
    expect(begun.stream.current).toBe(begun.room);
  });

  it('leaves a retiring engine’s queued room where it is while no other pair has room for it', async () => {
    const t = await setup();
    t.registry.set(engineSession('p0', 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    const { room, stream } = t.roomOn('p0', 'd0');
    await stream.admitted;
    t.registry.retiring.add('d0');
    expect(await t.migrator.moveQueued('d0')).toBe(0);
    expect(t.typesOf(room)).toEqual(['room.created']);
    expect(stream.current).toBe(room);
    // A new request is told why no pair takes it (a client asks again while that is so).
    expect(() => t.intake.pick(2, 8)).toThrow(
      expect.objectContaining({
        message:
          'no decode engine takes new requests now (every one is being retired); retry later',
        operatorHint:
          'every decode engine is being retired (d0): none takes new rooms until another decode engine registers',
      }),
    );
  });
});

describe('Intake.pick with headroom (a batch request while interactive ones come)', () => {
  it('takes a pair only where room for one more is left after it, and says so when that is all that holds it', async () => {
    // Two rooms a decode engine, one of them taken.
    const t = await setup(2, 2);
    t.registry.set(engineSession('p0', 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    expect(t.intake.pick(2, 8, [], null, [], true).decode.engine).toBe('d0');
    await t.roomOn('p0', 'd0').stream.admitted;
    expect(t.intake.pick(2, 8).decode.engine).toBe('d0');
    expect(() => t.intake.pick(2, 8, [], null, [], true)).toThrow(
      /^the room left is kept for interactive requests while they come; retry shortly$/,
    );
  });

  it('keeps none where an engine could never hold two: the request goes where it fits', async () => {
    const t = await setup(2, 1);
    t.registry.set(engineSession('p0', 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    expect(t.intake.pick(2, 8, [], null, [], true).decode.engine).toBe('d0');
  });
});
