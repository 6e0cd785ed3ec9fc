/**
 * Who leads a PostgreSQL journal (docs/journal.md, "PostgreSQL"). The leader's writing session
 * holds an advisory lock and renews a lease in the one `leadership` row; every append checks, in
 * its own transaction, that the row's term is still the leader's. A contender takes over when the
 * lock is free (the leader's session ended: kill -9, a crash, a lost host) or when the lease has
 * run out (the leader is frozen: SIGSTOP, a stalled VM), in which case it first terminates the
 * frozen leader's session. Either way it takes term + 1, and the old leader's next append is
 * refused however late it wakes up.
 */
import type pg from 'pg';

/** Key of the session advisory lock the leader holds ("pdld"). */
const LEADER_LOCK = 0x7064_6c64;

/** The database's clock in unix ms: every lease compares against it, never a host's clock. */
export const DB_NOW = '(extract(epoch from clock_timestamp()) * 1000)::bigint';

export interface LeaderRow {
  term: number;
  holder: string | null;
  backendPid: number | null;
  leaseUntil: number;
  acquiredAt: number;
  /** The database's clock when read. */
  now: number;
}

export type TakeoverHow = 'vacant' | 'resigned' | 'holder_gone' | 'lease_expired';

export type LeadAttempt =
  | { ok: true; term: number; how: TakeoverHow; previous: string | null }
  | { ok: false; current: LeaderRow };

export async function readLeader(c: pg.ClientBase): Promise<LeaderRow> {
  const r = await c.query<{
    term: number;
    holder: string | null;
    backend_pid: number | null;
    lease_until: number;
    acquired_at: number;
    now: number;
  }>(`SELECT term, holder, backend_pid, lease_until, acquired_at, ${DB_NOW} AS now
      FROM leadership WHERE id = 1`);
  const row = r.rows[0];
  if (!row) throw new Error('the leadership row is missing: the journal schema is damaged');
  return {
    term: row.term,
    holder: row.holder,
    backendPid: row.backend_pid,
    leaseUntil: row.lease_until,
    acquiredAt: row.acquired_at,
    now: row.now,
  };
}

async function tryLock(c: pg.ClientBase): Promise<boolean> {
  const r = await c.query<{ got: boolean }>('SELECT pg_try_advisory_lock($1) AS got', [
    LEADER_LOCK,
  ]);
  return r.rows[0]?.got === true;
}

/**
 * One attempt to lead, on the session that will write. Takes the lock (terminating a frozen
 * leader's session first when its lease has run out), then term + 1 with this session's pid and
 * a fresh lease, recorded in `leader_terms`.
 */
export async function tryLead(
  c: pg.ClientBase,
  holder: string,
  leaseMs: number,
): Promise<LeadAttempt> {
  let how: TakeoverHow | null = null;
  if (!(await tryLock(c))) {
    const current = await readLeader(c);
    if (current.leaseUntil >= current.now || current.backendPid === null) {
      return { ok: false, current };
    }
    // The lease ran out but the session lives on: the leader is frozen. End its session (which
    // also aborts any transaction it left open), then take the lock it held.
    await c.query('SELECT pg_terminate_backend($1, 2000)', [current.backendPid]);
    for (let i = 0; i < 20 && how === null; i++) {
      if (await tryLock(c)) how = 'lease_expired';
      else await new Promise((r) => setTimeout(r, 50));
    }
    if (how === null) return { ok: false, current: await readLeader(c) };
  }
  try {
    await c.query('BEGIN');
    const before = await c.query<{ holder: string | null; lease_until: number }>(
      'SELECT holder, lease_until FROM leadership WHERE id = 1 FOR UPDATE',
    );
    const previous = before.rows[0]?.holder ?? null;
    how ??=
      previous === null ? 'vacant' : before.rows[0]?.lease_until === 0 ? 'resigned' : 'holder_gone';
    const r = await c.query<{ term: number }>(
      `UPDATE leadership SET term = term + 1, holder = $1, backend_pid = pg_backend_pid(),
         lease_until = ${DB_NOW} + $2, acquired_at = ${DB_NOW}
       WHERE id = 1 RETURNING term`,
      [holder, leaseMs],
    );
    const term = r.rows[0]?.term as number;
    await c.query(
      `INSERT INTO leader_terms (term, holder, acquired_at, how, previous)
       VALUES ($1, $2, ${DB_NOW}, $3, $4)`,
      [term, holder, how, previous],
    );
    await c.query('COMMIT');
    return { ok: true, term, how, previous };
  } catch (err) {
    await c.query('ROLLBACK').catch(() => {});
    await c.query('SELECT pg_advisory_unlock($1)', [LEADER_LOCK]).catch(() => {});
    throw err;
  }
}

/**
 * After this process's writing session was lost and a new one opened: leads on under the same
 * term if nobody took over meanwhile. False: another control plane leads now.
 */
export async function resumeLead(
  c: pg.ClientBase,
  term: number,
  leaseMs: number,
): Promise<boolean> {
  if (!(await tryLock(c))) return false;
  const r = await c.query(
    `UPDATE leadership SET backend_pid = pg_backend_pid(), lease_until = ${DB_NOW} + $2
     WHERE id = 1 AND term = $1`,
    [term, leaseMs],
  );
  if (r.rowCount === 1) return true;
  await c.query('SELECT pg_advisory_unlock($1)', [LEADER_LOCK]);
  return false;
}

/** Extends the lease; false when the term is no longer this leader's (it was deposed). */
export async function renewLease(
  c: pg.ClientBase,
  term: number,
  leaseMs: number,
): Promise<boolean> {
  const r = await c.query(
    `UPDATE leadership SET lease_until = ${DB_NOW} + $2 WHERE id = 1 AND term = $1`,
    [term, leaseMs],
  );
  return r.rowCount === 1;
}

/** A leader that shuts down cleanly hands over at once: its lease ends now, its lock is freed. */
export async function resign(c: pg.ClientBase, term: number): Promise<void> {
  await c.query(
    'UPDATE leadership SET lease_until = 0, backend_pid = NULL WHERE id = 1 AND term = $1',
    [term],
  );
  await c.query('SELECT pg_advisory_unlock($1)', [LEADER_LOCK]);
}

/**
 * The SQL condition an append's statement carries: true only while `term` (parameter `$n`) is
 * the current one. FOR SHARE holds the row until COMMIT, so a contender's term + 1 waits for the
 * append to finish and every later append sees the new term.
 */
export function fenced(param: string): string {
  return `(SELECT term FROM leadership WHERE id = 1 FOR SHARE) = ${param}`;
}
