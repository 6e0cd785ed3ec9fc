/**
 * Every shipped schema has a frozen fixture journal (test/fixtures/journal-schema-NNNN.db, made by
 * make-fixture.ts and never edited). Each must open, migrate to head, verify, and keep its data.
 * Files that are not journals we can use must be refused with a clear error and left untouched.
 */
import { createHash } from 'node:crypto';
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  writeFileSync,
} from 'node:fs';
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import {
  CHECKPOINT_NAME,
  decodeCheckpoint,
  encodeCheckpoint,
} from '../src/control/checkpoint/codec.ts';
import { StartState } from '../src/control/checkpoint/state.ts';
import { JournalError } from '../src/journal/errors.ts';
import { checkpointBreakingMigration } from '../src/journal/migrations.ts';
import { pgMigrations } from '../src/journal/postgres/migrate.ts';
import { SqliteJournal } from '../src/journal/sqlite/journal.ts';
import {
  headVersion,
  loadMigrations,
  migrate,
  schemaVersion,
} from '../src/journal/sqlite/migrate.ts';
import { SqliteReader } from '../src/journal/sqlite/reader.ts';
import type { StoredCheckpoint } from '../src/journal/store.ts';
import { eventIdOf } from '../src/room/event-keys.ts';
import { DEFAULT_STATE_DEADLINES_MS } from '../src/room/states.ts';
import { lifecycle } from './helpers/events.ts';
import { tempDir } from './helpers/tmp.ts';

const FIXTURES = new URL('./fixtures/', import.meta.url).pathname;
const dir = tempDir('pdctl-migrate-');
const sha = (path: string) => createHash('sha256').update(readFileSync(path)).digest('hex');

describe('migrations', () => {
  it('has a frozen fixture for every shipped schema version', () => {
    const fixtures = readdirSync(FIXTURES).filter((f) => /^journal-schema-\d{4}\.db$/.test(f));
    const expected = loadMigrations().map(
      (m) => `journal-schema-${String(m.version).padStart(4, '0')}.db`,
    );
    expect(fixtures.sort()).toEqual(expected);
  });

  for (const m of loadMigrations()) {
    const name = `journal-schema-${String(m.version).padStart(4, '0')}`;
    it(`opens the schema ${m.version} fixture, migrates it to head (${headVersion()}) and keeps every event`, async () => {
      const path = `${dir}/${name}.db`;
      copyFileSync(`${FIXTURES}${name}.db`, path);
      if (m.version < 3) {
        // pdctl journaled a request id on room.created before schema 3 gave rooms the column
        // (its fixtures were made without one): schema 3 takes it from there.
        const db = new Database(path);
        db.prepare(
          `UPDATE events SET data = json_set(data, '$.requestId', 'req-' || room) WHERE type = 'room.created'`,
        ).run();
        db.close();
      }
      if (m.version < 5) {
        // Event ids of every form schema 5 turns into keys: the fixtures hold UUIDs only; add
        // engines' ids in their namespace (`<source>/<UUID>`) and ids of any other text.
        const db = new Database(path);
        db.prepare(
          `UPDATE events SET event_id = source || '/' || event_id WHERE seq % 3 = 1`,
        ).run();
        db.prepare(`UPDATE events SET event_id = 'id-' || seq || '-é' WHERE seq % 3 = 2`).run();
        db.close();
      }
      if (m.version < 7) {
        // Data of the shapes schema 7 splits into event_shared (the fixtures' rooms have none):
        // the deadline table (the defaults, as the rooms' projection holds), and a bootstrap's pool
        // and epoch in the order pdctl writes them — or, every other one, in an order a patch
        // could not give back, which must stay whole.
        const db = new Database(path);
        db.prepare(
          `UPDATE events SET data = json_set(data, '$.deadlinesMs', json(?)) WHERE type = 'room.created'`,
        ).run(JSON.stringify(DEFAULT_STATE_DEADLINES_MS));
        db.prepare(
          `UPDATE events SET data = CASE WHEN seq % 2 = 0
             THEN json_set(json_remove(data, '$.epoch'), '$.pool', '/pdctl-d0-1', '$.epoch', 5)
             ELSE json_set(data, '$.pool', '/pdctl-d0-1') END
           WHERE type = 'room.bootstrapped'`,
        ).run();
        db.close();
      }
      const expected = JSON.parse(readFileSync(`${FIXTURES}${name}.json`, 'utf8'));
      // Event ids as the fixture holds them: text before schema 5 (its migration makes them keys).
      const raw = new Database(path, { readonly: true });
      const ids = raw
        .prepare('SELECT seq, event_id, source FROM events ORDER BY seq')
        .all() as Array<{
        seq: number;
        event_id: string | Buffer;
        source: string;
      }>;
      const columns = 'SELECT seq, ts, type, room, engine, source, data FROM events ORDER BY seq';
      const before = raw.prepare(columns).all();
      raw.close();
      const journal = await SqliteJournal.open({ path, create: false });
      try {
        const stats = await journal.stats();
        expect(stats.schemaVersion).toBe(headVersion());
        expect({
          events: stats.events,
          rooms: stats.rooms,
          byState: stats.byState,
          rejectedEvents: stats.rejectedEvents,
        }).toEqual(expected);
        expect((await journal.verify()).ok).toBe(true);
        // Every event keeps its id, whatever form the fixture stored it in.
        const read = (await journal.readFrom(0, 100_000)).map((e) => [e.seq, e.eventId]);
        expect(read).toEqual(
          ids.map((r) => [
            r.seq,
            typeof r.event_id === 'string' ? r.event_id : eventIdOf(r.event_id, r.source),
          ]),
        );
        expect(new Set(read.map(([, id]) => id)).size).toBe(read.length);
        // And every other column, text for text, as plain SQL reads it.
        const after = new Database(path, { readonly: true });
        expect(after.prepare(columns).all()).toEqual(before);
        // Both kinds were there to keep: split rows, and bootstraps stored whole.
        const kept = after
          .prepare(
            `SELECT count(e.shared) AS split, count(*) - count(e.shared) AS whole FROM event_rows e
              JOIN event_names t ON t.id = e.type WHERE t.name = 'room.bootstrapped'`,
          )
          .get() as { split: number; whole: number };
        after.close();
        expect(kept.split).toBeGreaterThan(0);
        if (m.version < 7) expect(kept.whole).toBeGreaterThan(0);
        // Schema 2's origin: every room takes its room.created's source; schema 3's request id,
        // its requestId (fixtures before schema 3 have none: null).
        const { rooms } = await journal.rooms({ limit: 10_000 });
        expect(rooms.length).toBe(expected.rooms);
        for (const r of rooms) {
          const created = (await journal.timeline(r.room)).events.find(
            (e) => e.type === 'room.created',
          );
          expect(r.origin, r.room).toBe(created?.source);
          expect(r.requestId, r.room).toBe(
            (created?.data as { requestId?: string } | undefined)?.requestId ?? null,
          );
        }
        const api = rooms.filter((r) => r.origin === 'api');
        expect(api.length).toBeGreaterThan(0);
        for (const r of api) {
          expect(r.requestId, r.room).toBe(`req-${r.migratedFrom ?? r.room}`);
          const found = await journal.rooms({ requestId: r.requestId as string });
          expect(found.rooms.map((x) => x.room)).toContain(r.room);
        }
        for (const ev of lifecycle('after-migration'))
          expect((await journal.append(ev)).status).toBe('applied');
        expect((await journal.verify()).ok).toBe(true);
      } finally {
        await journal.drain();
      }
    });
  }
});

describe('the migration runner', () => {
  const withExtra = (name: string, sql: string) => {
    const migrationsDir = `${dir}/migrations-${name}`;
    mkdirSync(migrationsDir);
    for (const m of loadMigrations()) {
      writeFileSync(`${migrationsDir}/${String(m.version).padStart(4, '0')}_${m.name}.sql`, m.sql);
    }
    writeFileSync(
      `${migrationsDir}/${String(headVersion() + 1).padStart(4, '0')}_${name}.sql`,
      sql,
    );
    return loadMigrations(migrationsDir);
  };

  it('applies a new migration to a journal of the previous schema, and records it', () => {
    const path = `${dir}/next.db`;
    copyFileSync(`${FIXTURES}journal-schema-0001.db`, path);
    const db = new Database(path);
    migrate(db);
    expect(migrate(db, withExtra('add_notes', 'ALTER TABLE rooms ADD COLUMN notes TEXT;'))).toEqual(
      [headVersion() + 1],
    );
    expect(schemaVersion(db)).toBe(headVersion() + 1);
    expect(db.prepare('SELECT count(*) FROM events').pluck().get()).toBeGreaterThan(0);
    db.close();
  });

  it('says which migration since a checkpoint changed what events read back, if any', () => {
    // Every migration since state checkpoints exist reads events back as before (`-- checkpoints: kept`).
    const head = headVersion();
    expect(checkpointBreakingMigration(loadMigrations(), 4, head)).toBeNull();
    expect(checkpointBreakingMigration(pgMigrations(), 3, pgMigrations().length)).toBeNull();
    const next = String(head + 1).padStart(4, '0');
    const kept = withExtra('kept', '-- checkpoints: kept (an index only).\nSELECT 1;');
    expect(checkpointBreakingMigration(kept, 4, head + 1)).toBeNull();
    const changed = withExtra('changed', '-- rewrites data\nSELECT 1;');
    expect(checkpointBreakingMigration(changed, 4, head + 1)).toBe(`${next}_changed`);
    expect(checkpointBreakingMigration(changed, head + 1, head + 1)).toBeNull();
  });

  it('a start trusts a checkpoint written before the migrations since (schema 4, the first with them)', async () => {
    const path = `${dir}/checkpoint-older.db`;
    let j = await SqliteJournal.open({ path });
    const state = new StartState(0);
    await j.setCheckpoint(encodeCheckpoint(state, state.index));
    await j.drain();
    const db = new Database(path);
    db.prepare('UPDATE state_checkpoints SET schema_version = 4').run();
    db.close();
    j = await SqliteJournal.open({ path });
    try {
      const stored = await j.getCheckpoint(CHECKPOINT_NAME);
      expect(stored).toMatchObject({ schemaVersion: 4, currentSchemaVersion: headVersion() });
      expect(stored?.brokenBy).toBeNull();
      expect(decodeCheckpoint(stored as StoredCheckpoint, await j.headSeq())).toHaveProperty(
        'state',
      );
    } finally {
      await j.drain();
    }
  });

  it('rolls a failing migration back whole and names it', () => {
    const path = `${dir}/broken.db`;
    copyFileSync(`${FIXTURES}journal-schema-0001.db`, path);
    const db = new Database(path);
    const broken = withExtra(
      'broken',
      'CREATE TABLE half_done (x INTEGER); SELECT * FROM no_such_table;',
    );
    const number = String(headVersion() + 1).padStart(4, '0');
    expect(() => migrate(db, broken)).toThrow(
      new RegExp(`migration ${number}_broken failed and was rolled back`),
    );
    expect(schemaVersion(db)).toBe(headVersion());
    expect(
      db.prepare("SELECT count(*) FROM sqlite_master WHERE name = 'half_done'").pluck().get(),
    ).toBe(0);
    db.close();
  });

  it('refuses a migrations folder with a gap in its numbering', () => {
    const gap = `${dir}/migrations-gap`;
    mkdirSync(gap);
    writeFileSync(`${gap}/0001_a.sql`, 'SELECT 1;');
    writeFileSync(`${gap}/0003_c.sql`, 'SELECT 1;');
    expect(() => loadMigrations(gap)).toThrow(/without gaps/);
  });
});

describe('journals that cannot be used are refused and never modified', () => {
  const expectRefused = async (path: string, code: JournalError['code'], message: RegExp) => {
    const before = existsSync(path) ? sha(path) : null;
    for (const open of [() => SqliteJournal.open({ path }), async () => new SqliteReader(path)]) {
      const err = await open().then(
        (j) => {
          j.close();
          return null;
        },
        (e: unknown) => e,
      );
      expect(err).toBeInstanceOf(JournalError);
      expect((err as JournalError).code).toBe(code);
      expect((err as JournalError).message).toMatch(message);
      expect(existsSync(path) ? sha(path) : null).toBe(before);
    }
  };

  it('refuses a journal written by a newer schema', async () => {
    const path = `${dir}/newer.db`;
    copyFileSync(`${FIXTURES}journal-schema-0001.db`, path);
    const db = new Database(path);
    db.prepare('INSERT INTO schema_migrations VALUES (?, ?, ?)').run(
      99,
      'from_the_future',
      Date.now(),
    );
    db.close();
    await expectRefused(path, 'JOURNAL_VERSION_CONFLICT', /schema version 99.*upgrade pdctl/);
  });

  it('refuses a corrupt file', async () => {
    const path = `${dir}/corrupt.db`;
    writeFileSync(path, Buffer.from('this is not a database at all, just some bytes'.repeat(200)));
    await expectRefused(path, 'JOURNAL_CORRUPT', /damaged or is not a SQLite database/);
  });

  it('refuses a SQLite database that is not a pdctl journal', async () => {
    const path = `${dir}/other.db`;
    const db = new Database(path);
    db.exec('CREATE TABLE customers (id INTEGER PRIMARY KEY)');
    db.close();
    await expectRefused(path, 'JOURNAL_CORRUPT', /not a pdctl journal/);
  });

  it('refuses a missing file unless asked to create it', async () => {
    const path = `${dir}/missing.db`;
    await expect(SqliteJournal.open({ path, create: false })).rejects.toMatchObject({
      code: 'JOURNAL_NOT_FOUND',
    });
    expect(() => new SqliteReader(path)).toThrow(/no journal at/);
    expect(existsSync(path)).toBe(false);
  });
});
