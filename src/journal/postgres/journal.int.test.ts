import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { created } from '../../../test/helpers/events.ts';
import { journalContract } from '../../../test/helpers/journal-contract.ts';
import { freshDatabase, havePostgres } from '../../../test/helpers/postgres.ts';
import { spawnTs } from '../../../test/helpers/spawn.ts';
import { waitFor } from '../../../test/helpers/wait.ts';
import { PgJournal } from './journal.ts';
import { pgMigrate, pgMigrations } from './migrate.ts';

const enabled = havePostgres();

const open = (url: string, opts: Partial<Parameters<typeof PgJournal.open>[0]> = {}) =>
  PgJournal.open({ url, ...opts });

async function sql<R extends pg.QueryResultRow>(url: string, text: string, values: unknown[] = []) {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return (await c.query<R>(text, values)).rows;
  } finally {
    await c.end();
  }
}

describe.runIf(enabled)('PostgreSQL', () => {
  journalContract({
    name: 'PostgreSQL',
    fresh: async (opts = {}) => open(await freshDatabase(), opts),
    place: freshDatabase,
    open: (url) => open(url),
    async countCommitted(j, seq) {
      const [r] = await sql<{ n: string }>(
        (j as PgJournal & { url: string }).url,
        'SELECT count(*) AS n FROM events WHERE seq <= $1',
        [seq],
      );
      return Number(r?.n);
    },
  });

  describe('PostgreSQL journal: leadership and fencing', () => {
    it('records who leads, and refuses a second leader with the holder and its lease in the message', async () => {
      const url = await freshDatabase();
      const a = await open(url, { holder: 'cp-a' });
      try {
        expect(a.leadership).toMatchObject({ term: 1, holder: 'cp-a', how: 'vacant' });
        const err = await open(url, { holder: 'cp-b' }).catch((e: unknown) => e);
        expect(err).toMatchObject({ code: 'JOURNAL_BUSY' });
        expect((err as Error).message).toMatch(/led by cp-a \(term 1, lease \d+ ms left\)/);
      } finally {
        await a.drain();
      }
      // A clean shutdown hands over at once: the next leader takes term 2 without waiting.
      const b = await open(url, { holder: 'cp-b' });
      expect(b.leadership).toMatchObject({ term: 2, how: 'resigned', previous: 'cp-a' });
      await b.drain();
      const terms = await sql(url, 'SELECT term, holder, how FROM leader_terms ORDER BY term');
      expect(terms).toEqual([
        { term: '1', holder: 'cp-a', how: 'vacant' },
        { term: '2', holder: 'cp-b', how: 'resigned' },
      ]);
    });

    it('refuses every write of a leader whose term was taken, writes nothing, and says it was deposed', async () => {
      const url = await freshDatabase();
      const a = await open(url, { holder: 'cp-a' });
      try {
        await a.append(created('before'));
        const deposed: string[] = [];
        a.onDeposed((why) => deposed.push(why));
        // A successor's term, as tryLead writes it (the lock aside): the fence alone must hold.
        await sql(url, 'UPDATE leadership SET term = term + 1, holder = $1 WHERE id = 1', ['cp-b']);
        const err = await a.append(created('after')).catch((e: unknown) => e);
        expect(err).toMatchObject({ code: 'JOURNAL_FENCED' });
        await expect(a.setCursor('watchdog', 1)).rejects.toMatchObject({ code: 'JOURNAL_FENCED' });
        expect(deposed).toHaveLength(1);
        expect(a.health()).toMatchObject({ state: 'failed', writable: false });
        const rooms = await sql<{ room: string; term: string }>(
          url,
          'SELECT room, term FROM events ORDER BY seq',
        );
        expect(rooms).toEqual([{ room: 'before', term: '1' }]);
        expect((await a.verify()).ok).toBe(true);
      } finally {
        await a.drain();
      }
    });

    it('leads on under its term when its session is lost and nobody took over; queued appends commit', async () => {
      const url = await freshDatabase();
      const a = await open(url, { holder: 'cp-a' });
      try {
        await a.append(created('r0'));
        await sql(
          url,
          "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pdctl writer' AND datname = current_database()",
        );
        // Retried with the same ids until the session is back, as engines do.
        const results = await Promise.all(
          Array.from({ length: 20 }, async (_, i) => {
            for (let t = 0; ; t++) {
              try {
                return await a.append({ ...created(`r${i + 1}`), eventId: `r${i + 1}-c` });
              } catch (err) {
                if (t > 100) throw err;
                await new Promise((r) => setTimeout(r, 50));
              }
            }
          }),
        );
        expect(results.every((r) => r.status === 'applied' || r.status === 'duplicate')).toBe(true);
        expect(a.health()).toMatchObject({ state: 'ready', writable: true });
        expect(a.health().writerRestarts).toBeGreaterThanOrEqual(1);
        expect(a.leadership.term).toBe(1);
        expect((await a.stats()).rooms).toBe(21);
        expect((await a.verify()).ok).toBe(true);
      } finally {
        await a.drain();
      }
    });

    it('is taken over by a standby at once when its session ends (the process died)', async () => {
      const url = await freshDatabase();
      const a = await open(url, { holder: 'cp-a', leaseMs: 10_000 });
      await a.append(created('a-1'));
      const waiting: string[] = [];
      const standby = open(url, {
        holder: 'cp-b',
        waitForLead: { onWaiting: (cur) => waiting.push(cur.holder ?? '') },
      });
      await new Promise((r) => setTimeout(r, 300));
      expect(waiting).toEqual(['cp-a']);
      // Stopping without resigning: the session ends as a killed process's does, lease untouched.
      const started = Date.now();
      a.close();
      const b = await standby;
      try {
        // Well inside the 10 s lease: the free lock is what told the standby.
        expect(Date.now() - started).toBeLessThan(3000);
        expect(b.leadership).toMatchObject({ term: 2, how: 'holder_gone', previous: 'cp-a' });
        expect((await b.append(created('b-1'))).status).toBe('applied');
        expect((await b.verify()).ok).toBe(true);
      } finally {
        await b.drain();
      }
    });

    it('keeps standing by when its own session is lost, and takes over later', async () => {
      const url = await freshDatabase();
      const a = await open(url, { holder: 'cp-a' });
      const lost: string[] = [];
      const standby = open(url, {
        holder: 'cp-b',
        waitForLead: { onUnreachable: (e) => lost.push(e.code) },
      });
      await new Promise((r) => setTimeout(r, 300));
      // The standby's session, not the leader's, is cut (a database failover, say).
      await sql(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pdctl writer' AND datname = current_database() AND pid <> (SELECT backend_pid FROM leadership)",
      );
      await waitFor('the standby to notice', () => lost.length > 0, 5000);
      expect(lost[0]).toBe('JOURNAL_UNREACHABLE');
      expect((await a.append(created('a-1'))).status).toBe('applied');
      await a.drain();
      const b = await standby;
      try {
        expect(b.leadership).toMatchObject({ term: 2, how: 'resigned' });
        expect((await b.append(created('b-1'))).status).toBe('applied');
      } finally {
        await b.drain();
      }
    });

    it('takes over from a frozen leader when its lease runs out; the leader wakes up fenced', async () => {
      const url = await freshDatabase();
      const child = spawnTs('test/helpers/pg-leader-child.ts', [url, 'cp-a', '600']);
      let out = '';
      child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
      await waitFor('the leader to append', () => /ack cp-a-3\n/.test(out), 20_000);
      child.kill('SIGSTOP');
      const frozenAt = Date.now();
      const b = await open(url, { holder: 'cp-b', leaseMs: 600, waitForLead: {} });
      try {
        const tookMs = Date.now() - frozenAt;
        expect(b.leadership).toMatchObject({ term: 2, how: 'lease_expired', previous: 'cp-a' });
        expect(tookMs).toBeLessThan(5000);
        expect((await b.append(created('b-1'))).status).toBe('applied');
        child.kill('SIGCONT');
        await waitFor(
          'the old leader to learn it was deposed',
          () => /^deposed$/m.test(out),
          20_000,
        );
        await waitFor('a fenced append', () => /^refused JOURNAL_FENCED$/m.test(out), 5000);
        const rows = await sql<{ room: string; term: string }>(
          url,
          'SELECT room, term FROM events ORDER BY seq',
        );
        // One leader at a time: every event of term 1 comes before every event of term 2, and
        // term 2 holds only the new leader's.
        const firstOfB = rows.findIndex((r) => r.term === '2');
        expect(rows.slice(0, firstOfB).every((r) => r.term === '1')).toBe(true);
        expect(rows.slice(firstOfB)).toEqual([{ room: 'b-1', term: '2' }]);
        // No acknowledged event lost: every room the old leader acknowledged is stored.
        const stored = new Set(rows.map((r) => r.room));
        const acked = [...out.matchAll(/^ack (\S+)$/gm)].map((m) => m[1] as string);
        expect(acked.length).toBeGreaterThanOrEqual(4);
        expect(acked.filter((r) => !stored.has(r))).toEqual([]);
        expect((await b.verify()).ok).toBe(true);
      } finally {
        child.kill('SIGKILL');
        await b.drain();
      }
    });
  });

  describe('PostgreSQL journal: bad places', () => {
    it('says what is wrong with a URL, a missing database, a server that is not there', async () => {
      await expect(open('postgres://')).rejects.toMatchObject({ code: 'JOURNAL_BAD_QUERY' });
      await expect(open('postgres://u@127.0.0.1:5432')).rejects.toThrow(/names no database/);
      const url = new URL(await freshDatabase());
      url.pathname = '/no_such_db';
      const missing = await open(url.toString()).catch((e: unknown) => e);
      expect(missing).toMatchObject({ code: 'JOURNAL_NOT_FOUND' });
      expect((missing as Error).message).toMatch(/no_such_db.*create it first/);
      const refused = await open('postgres://u:secret@127.0.0.1:1/x').catch((e: unknown) => e);
      expect(refused).toMatchObject({ code: 'JOURNAL_UNREACHABLE' });
      expect((refused as Error).message).not.toContain('secret');
    });

    it('refuses a database of a newer pdctl, and one with tables that are not a journal', async () => {
      const newer = await freshDatabase();
      await (await open(newer)).drain();
      await sql(newer, "INSERT INTO schema_migrations VALUES (99, 'future', 0)");
      await expect(open(newer)).rejects.toMatchObject({ code: 'JOURNAL_VERSION_CONFLICT' });
      const other = await freshDatabase();
      await sql(other, 'CREATE TABLE events (id int)');
      await expect(open(other)).rejects.toMatchObject({ code: 'JOURNAL_CORRUPT' });
    });

    it('migrates a schema-3 journal: every event keeps its id, and a retry of one is a duplicate', async () => {
      const url = await freshDatabase();
      const c = new pg.Client({ connectionString: url });
      await c.connect();
      try {
        await pgMigrate(c, url, pgMigrations().slice(0, 3));
      } finally {
        await c.end();
      }
      const uuid = '01a23fd8-2e22-7000-9901-83b1267ddc83';
      const canary = { ok: true, stage: null, reason: null, ms: 1 };
      const ids: Array<[source: string, id: string]> = [
        ['api', uuid],
        ['engine:d0', `engine:d0/${uuid.replace('9901', '9902')}`],
        ['watchdog', 'r-1:aborted'],
        ['api', `engine:d0/${uuid.replace('9901', '9903')}`],
      ];
      for (const [i, [source, id]] of ids.entries()) {
        await sql(
          url,
          `INSERT INTO events (seq, ts, type, source, event_id, data, term)
           VALUES ($1, 1, 'canary.changed', $2, $3, $4, 0)`,
          [i + 1, source, id, JSON.stringify(canary)],
        );
      }
      const j = await open(url);
      try {
        expect((await j.readFrom(0, 10)).map((e) => [e.source, e.eventId])).toEqual(ids);
        const [stored] = await sql<{ n: string }>(
          url,
          'SELECT sum(octet_length(event_id)) AS n FROM events WHERE seq <= 3',
        );
        expect(Number(stored?.n)).toBe(17 + 17 + 12);
        const [source, eventId] = ids[1] as [string, string];
        const retry = await j.append({
          type: 'canary.changed',
          room: null,
          engine: null,
          source,
          eventId,
          data: canary,
        } as never);
        expect(retry).toMatchObject({ status: 'duplicate', seq: 2 });
      } finally {
        await j.drain();
      }
    });

    it('verify finds a projection row that differs from the fold', async () => {
      const url = await freshDatabase();
      const j = await open(url);
      try {
        await j.append(created('v'));
        await sql(url, "UPDATE rooms SET state = 'decoding' WHERE room = 'v'");
        const v = await j.verify();
        expect(v.ok).toBe(false);
        expect(v.mismatches).toEqual([
          { room: 'v', field: 'state', projection: 'decoding', fold: 'created' },
        ]);
      } finally {
        await j.drain();
      }
    });
  });
});
