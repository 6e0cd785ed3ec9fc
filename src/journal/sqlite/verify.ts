/**
 * `pdctl journal verify` on SQLite: the integrity check, the ordering and bookkeeping invariants
 * of `events`, and a rebuild of the `rooms` projection from scratch (src/journal/verify.ts).
 */
import type Database from 'better-sqlite3';
import { ROOM_COLUMNS } from '../rows.ts';
import type { VerifyReport } from '../store.ts';
import {
  cursorProblems,
  FOLD_PAGE,
  type FoldRow,
  JournalFold,
  ProjectionCheck,
} from '../verify.ts';
import { type PackDecoder, WindowedRead } from './packs/reads.ts';
import { HEAD_SEQ_SQL } from './packs/sql.ts';

/** Folds every event of the journal in seq order, straight off the rows. */
export function foldJournal(db: Database.Database): JournalFold {
  return foldWithPacks(db).fold;
}

/** The fold, and what the packs it decoded hold wrong. */
function foldWithPacks(db: Database.Database): { fold: JournalFold; packs: PackDecoder } {
  const fold = new JournalFold();
  const pages = new WindowedRead<FoldRow>(db, 'fold');
  // Pages of rows via all() are faster than iterate() (fewer crossings into the addon).
  for (;;) {
    const rows = pages.page(fold.lastSeq, FOLD_PAGE);
    fold.add(rows);
    if (rows.length < FOLD_PAGE) break;
  }
  return { fold, packs: pages.packs };
}

export function verifyJournal(db: Database.Database): VerifyReport {
  const started = process.hrtime.bigint();
  const integrity = (db.prepare('PRAGMA integrity_check').pluck().all() as string[]).join('; ');
  const { fold, packs } = foldWithPacks(db);
  const problems: string[] = [];
  if (integrity !== 'ok') problems.push(`integrity_check: ${integrity}`);

  const sequence = db
    .prepare("SELECT seq FROM sqlite_sequence WHERE name = 'event_rows'")
    .pluck()
    .get() as number | undefined;
  const maxSeq = db.prepare(HEAD_SEQ_SQL).pluck().get() as number;
  if (sequence !== undefined && sequence < maxSeq) {
    problems.push(`sqlite_sequence (${sequence}) is behind the newest seq (${maxSeq})`);
  }
  problems.push(...referenceProblems(db), ...packProblems(db, packs));
  const cursors = db.prepare('SELECT name, seq FROM consumers').all() as Array<{
    name: string;
    seq: number;
  }>;
  problems.push(...cursorProblems(cursors, maxSeq));

  const check = new ProjectionCheck(fold);
  const stmt = db.prepare(`SELECT ${ROOM_COLUMNS.join(', ')} FROM rooms`).raw();
  for (const row of stmt.iterate() as IterableIterator<Array<string | number | null>>) {
    check.row(row);
  }
  return check.report(integrity, problems, started);
}

/** Packs that name no room, that are damaged or refer to what is missing (schema 8). */
function packProblems(db: Database.Database, decoded: PackDecoder): string[] {
  const problems: string[] = [];
  const orphans = db
    .prepare(
      'SELECT count(*) FROM room_packs p WHERE NOT EXISTS (SELECT 1 FROM rooms WHERE id = p.room)',
    )
    .pluck()
    .get() as number;
  if (orphans > 0) problems.push(`${orphans} packs of room_packs name no row of rooms`);
  if (decoded.damaged.size > 0) {
    problems.push(
      `${decoded.damaged.size} packs of room_packs are damaged (not JSON, keys missing, or a seq outside their bounds), first at seq ${least(decoded.damaged)}`,
    );
  }
  if (decoded.dangling.size > 0) {
    problems.push(
      `${decoded.dangling.size} packs of room_packs refer to a shape, name or shared part that event_shapes, event_names or event_shared lacks, first at seq ${least(decoded.dangling)}`,
    );
  }
  return problems;
}

function least(seqs: Set<number>): number {
  let min = Number.POSITIVE_INFINITY;
  for (const s of seqs) if (s < min) min = s;
  return min;
}

/** Every id in `event_rows` names a row of its table (schema 7), and every room id is used. */
function referenceProblems(db: Database.Database): string[] {
  const problems: string[] = [];
  const dangling = db
    .prepare(
      `SELECT count(*) FROM event_rows e
        WHERE NOT EXISTS (SELECT 1 FROM event_names WHERE id = e.type)
           OR NOT EXISTS (SELECT 1 FROM event_names WHERE id = e.source)
           OR (e.engine IS NOT NULL AND NOT EXISTS (SELECT 1 FROM event_names WHERE id = e.engine))
           OR (e.room IS NOT NULL AND NOT EXISTS (SELECT 1 FROM event_rooms WHERE id = e.room))
           OR (e.shared IS NOT NULL AND NOT EXISTS (SELECT 1 FROM event_shared WHERE id = e.shared))`,
    )
    .pluck()
    .get() as number;
  if (dangling > 0) {
    problems.push(
      `${dangling} events refer to a name, room or shared part that event_names, event_rooms or event_shared lacks`,
    );
  }
  const unused = db
    .prepare(
      `SELECT count(*) FROM event_rooms r
        WHERE NOT EXISTS (SELECT 1 FROM event_rows WHERE room = r.id)`,
    )
    .pluck()
    .get() as number;
  if (unused > 0) problems.push(`${unused} rooms of event_rooms have no event`);
  return problems;
}
