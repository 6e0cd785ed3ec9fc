/**
 * Which journal backend the processes run on: the one place (with `src/cli/journal/`, the journal
 * administration commands) that names SQLite. Everything else holds a `JournalStore` or a
 * `JournalReader` (src/journal/store.ts).
 */

import { SqliteJournal } from '../journal/sqlite/journal.ts';
import { SqliteReader } from '../journal/sqlite/reader.ts';
import type { Durability, JournalReader } from '../journal/store.ts';
import type { Logger } from '../log.ts';

export interface JournalOpenOptions {
  /** The journal file; created (with its directory) when missing. */
  path: string;
  durability?: Durability;
  log: Logger;
  /** Journals `journal.opened` with this source and version once open. */
  announce?: { source: string; version: string };
}

/**
 * The journal a control plane writes. Its type is the SQLite one on purpose: drills and tests
 * fill its disk (`limitPagesForDrill`) or crash its writer through it.
 */
export function openJournal(o: JournalOpenOptions): Promise<SqliteJournal> {
  return SqliteJournal.open({
    path: o.path,
    durability: o.durability,
    logger: o.log,
    announce: o.announce,
  });
}

/** A journal file opened for reading only (it is never modified): the query commands' view. */
export function openJournalReader(path: string): JournalReader {
  return new SqliteReader(path);
}
