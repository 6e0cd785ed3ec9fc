/**
 * Migration against a real journal: what it journals for a lost engine's rooms, and what the
 * client's stream sees, when a healthy pair is free, when none comes, and past the limit. The
 * control plane is stood in for by a host that folds committed events as the plane does; the
 * whole-stack migrations (SIGKILLed engines) are in test/engine-restart.e2e.test.ts.
 */
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { engineSession } from '../../test/helpers/engine-session.ts';
import { tempDir } from '../../test/helpers/tmp.ts';
import type { RoomRequest } from '../bus/protocol.ts';
import type { JournalEvent } from '../journal/events.ts';
import { newRoomId } from '../journal/ids.ts';
import { type Room, reduce } from '../journal/reducer.ts';
import { SqliteJournal } from '../journal/sqlite/journal.ts';
import { silentLogger } from '../log.ts';
import { DeterministicModel } from '../model/deterministic.ts';
import { ControlError } from './errors.ts';
import { type MigrationHost, Migrator } from './migration.ts';
import { EngineRegistry } from './registry.ts';
import { RoomStream } from './streams.ts';

const dir = tempDir('pdctl-migration-');
const journals: SqliteJournal[] = [];
afterEach(async () => {
  for (const j of journals.splice(0)) await j.drain();
});

async function setup(limit = 2) {
  const journal = await SqliteJournal.open({
    path: join(dir, `${newRoomId()}.db`),
    durability: 'process',
  });
  journals.push(journal);
  const rooms = new Map<string, Room>();
  const events: JournalEvent[] = [];
  journal.subscribe(0, (ev) => {
    events.push(ev);
    if (ev.room === null) return;
    const r = reduce(rooms.get(ev.room) ?? null, ev);
    if (r.ok) rooms.set(ev.room, r.room);
  });
  const registry = new EngineRegistry();
  const created: Array<{ room: string; request: RoomRequest; prefill: string; from: string }> = [];
  const host: MigrationHost = {
    journal,
    registry,
    model: new DeterministicModel(),
    log: silentLogger,
    rooms,
    streams: new Map(),
    requests: new Map(),
    closing: () => false,
    createRoom: (_stream, room, request, _tokens, { prefill }, o) => {
      created.push({ room, request, prefill: prefill.engine, from: o.migratedFrom });
    },
    canHold: () => true,
    pairAvoided: () => false,
  };
  const migrator = new Migrator(host, { limit, waitMs: 200, engineFreshMs: 3000 });

  /** A live room on p0/d0 that has streamed `text` (words of the model's), its client still reading. */
  const liveRoom = async (text: string) => {
    const room = newRoomId();
    await journal.append({
      type: 'room.created',
      room,
      source: 'api',
      data: { prefillEngine: 'p0', decodeEngine: 'd0', promptTokens: 2, maxTokens: 8 },
    });
    const stream = new RoomStream(room, 2, Date.now());
    stream.push({ room, index: 0, text, tokens: 2 });
    host.streams.set(room, stream);
    (host.requests as Map<string, RoomRequest>).set(room, { prompt: 'the river', maxTokens: 8 });
    await until(() => rooms.has(room));
    return { room, stream };
  };
  const typesOf = (room: string) => events.filter((e) => e.room === room).map((e) => e.type);
  return { journal, registry, host, migrator, created, events, liveRoom, typesOf };
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
    t.registry.set(engineSession('p0', 'prefill', { liveRooms: 0 }));
    t.registry.set(engineSession('p1', 'prefill', { liveRooms: 5 }));
    t.registry.set(engineSession('d0', 'decode'));
    const { room, stream } = await t.liveRoom(' stone light');
    await t.migrator.engineLost('p0', 'p0-a', 'it exited');
    await until(() => t.created.length === 1);
    const [next] = t.created;
    expect(next).toMatchObject({
      from: room,
      prefill: 'p1',
      request: { prompt: 'the river', maxTokens: 6, generated: ' stone light' },
    });
    expect(stream.current).toBe(next?.room);
    expect(stream.migrations).toBe(1);
    await until(() => t.typesOf(room).includes('room.released'));
    expect(t.typesOf(room)).toEqual(['room.created', 'room.migrated', 'room.released']);
    const released = t.events.find((e) => e.room === room && e.type === 'room.released');
    expect(released?.engine).toBe('p0');
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
    expect(t.created).toEqual([]);
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

  it('fails the room instead once the request has used its migrations', async () => {
    const t = await setup(1);
    t.registry.set(engineSession('p1', 'prefill'));
    t.registry.set(engineSession('d0', 'decode'));
    const { room, stream } = await t.liveRoom(' stone light');
    stream.continueIn(room); // as if it had migrated once already
    await t.migrator.engineLost('d0', 'd0-a', 'it exited');
    await until(() => t.typesOf(room).includes('room.failed'));
    const failed = t.events.find((e) => e.room === room && e.type === 'room.failed');
    expect(failed?.data).toMatchObject({ reason: 'migration_limit_reached', stage: 'created' });
    expect(t.created).toEqual([]);
  });
});
