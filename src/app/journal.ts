/**
 * Which journal backend the processes run on: the one place (with `src/cli/journal/`, the journal
 * administration commands) that names SQLite or PostgreSQL. Everything else holds a
 * `JournalStore` or a `JournalReader` (src/journal/store.ts). `--journal` (or PDCTL_JOURNAL) is a
 * file path for SQLite or a postgres:// URL.
 */

import { createDatabase, startPgCluster } from '../journal/postgres/cluster.ts';
import { isPostgresUrl, redactUrl } from '../journal/postgres/connect.ts';
import { PgJournal } from '../journal/postgres/journal.ts';
import type { LeaderRow } from '../journal/postgres/leadership.ts';
import { PgReader } from '../journal/postgres/reader.ts';
import type { SqliteFaults } from '../journal/sqlite/faults.ts';
import { SqliteJournal } from '../journal/sqlite/journal.ts';
import { SqliteReader } from '../journal/sqlite/reader.ts';
import type { Durability, JournalReader } from '../journal/store.ts';
import type { Logger } from '../log.ts';

/**
 * The journal a control plane writes. Its type names the backends on purpose: drills and tests
 * reach SQLite's fault hooks (`faults`, when opened with them) and PostgreSQL's leadership
 * through it.
 */
export type ControlJournal = SqliteJournal | PgJournal;

export interface StandbyOptions {
  /** Stops the wait (SIGTERM while standing by). */
  signal?: AbortSignal;
  /** Called once when another control plane leads and this one starts to wait. */
  onWaiting?: (leader: LeaderRow) => void;
  /** The database could not be reached while waiting; the wait goes on once it can. */
  onUnreachable?: (err: Error) => void;
}

export interface JournalOpenOptions {
  /** The journal file (created, with its directory, when missing) or a postgres:// URL. */
  path: string;
  durability?: Durability;
  /** SQLite: create the file when missing (default true); false refuses a missing journal. */
  create?: boolean;
  log: Logger;
  /** Journals `journal.opened` with this source and version once open. */
  announce?: { source: string; version: string };
  /** SQLite: a file bigger than this is scanned after it opens, not before (`SqliteJournal`). */
  scanLaterAbove?: number;
  /** SQLite: how long that scan waits unless `scanNow()` starts it sooner (`SqliteJournal`). */
  scanAfterMs?: number;
  /** SQLite: give the journal its fault hooks (drills and tests; journal/sqlite/faults.ts). */
  faults?: boolean;
  /** Pack the events of rooms that ended this long ago (`SqliteJournal`, `PgJournal`); default never. */
  packAfterMs?: number;
  /**
   * PostgreSQL only: who this control plane is (shown to standbys and kept in `leader_terms`),
   * and, to run as a standby, how to wait while another leads. Without `standby`, a journal led
   * by another control plane is refused with JOURNAL_BUSY.
   */
  leadership?: { holder?: string; leaseMs?: number; standby?: StandbyOptions };
}

/**
 * The journal's fault hooks (a full disk, a crashed writer): SQLite's, when the stack was started
 * with `journalFaults`; null otherwise, and on PostgreSQL.
 */
export function journalFaults(journal: ControlJournal): SqliteFaults | null {
  return journal instanceof SqliteJournal ? journal.faults : null;
}

export function isPostgresJournal(path: string): boolean {
  return isPostgresUrl(path);
}

/** A journal URL without its password, for logs and messages. */
export function redactJournalUrl(url: string): string {
  return redactUrl(url);
}

export function openJournal(o: JournalOpenOptions): Promise<ControlJournal> {
  if (isPostgresUrl(o.path)) {
    return PgJournal.open({
      url: o.path,
      durability: o.durability,
      logger: o.log,
      announce: o.announce,
      holder: o.leadership?.holder,
      leaseMs: o.leadership?.leaseMs,
      waitForLead: o.leadership?.standby,
      packAfterMs: o.packAfterMs,
    });
  }
  return SqliteJournal.open({
    path: o.path,
    create: o.create,
    durability: o.durability,
    logger: o.log,
    announce: o.announce,
    scanLaterAbove: o.scanLaterAbove,
    scanAfterMs: o.scanAfterMs,
    packAfterMs: o.packAfterMs,
    faults: o.faults,
  });
}

/** A journal opened for reading only (it is never modified): the query commands' view. */
export function openJournalReader(path: string): JournalReader {
  return isPostgresUrl(path) ? new PgReader(path, { checkSchema: true }) : new SqliteReader(path);
}

/**
 * A PostgreSQL journal database for a drill: a new database on the server `adminUrl` names, or,
 * without one, on a throwaway cluster (initdb in a temp directory) that `dispose` removes.
 */
export async function drillPostgres(
  adminUrl: string | undefined,
  name: string,
): Promise<{ url: string; dispose(): void; throwaway: boolean }> {
  if (adminUrl !== undefined) {
    return { url: await createDatabase(adminUrl, name), dispose() {}, throwaway: false };
  }
  const cluster = await startPgCluster();
  try {
    return { url: await createDatabase(cluster.url, name), dispose: cluster.stop, throwaway: true };
  } catch (err) {
    cluster.stop();
    throw err;
  }
}
