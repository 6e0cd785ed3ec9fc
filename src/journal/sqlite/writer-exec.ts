/** Opening the writing connection and executing writer ops: shared by the inline and thread writers. */
import type Database from 'better-sqlite3';
import type { PendingEvent } from '../../room/events.ts';
import type { Outcome } from '../decide.ts';
import { JournalError } from '../errors.ts';
import { BatchWriter } from './batch-writer.ts';
import { classifySqliteError, openDatabase } from './open.ts';
import { HEAD_SEQ_SQL } from './packs/sql.ts';
import type { WriterInit, WriterOp, WriterResult } from './writer-protocol.ts';

export interface OpenedWriter {
  db: Database.Database;
  writer: BatchWriter | null;
  headSeq: number;
  /** SQLite's page cap when opened, restored after a `limit_pages` drill. */
  maxPageCount: number;
  /** The connection's `synchronous` as SQLite reports it (FULL, NORMAL…): what --durability set. */
  synchronous: string;
  /** The fence of the last append that failed: appends at or below it are refused unattempted. */
  failedFence: number;
}

const SYNCHRONOUS = ['OFF', 'NORMAL', 'FULL', 'EXTRA'];

export function openWriter(init: WriterInit): OpenedWriter {
  const db = openDatabase({
    path: init.path,
    durability: init.durability,
    create: init.create,
    precheck: init.role === 'writer',
    scan: init.scan ?? true,
  });
  const maxPageCount = db.pragma('max_page_count', { simple: true }) as number;
  const level = db.pragma('synchronous', { simple: true }) as number;
  const synchronous = SYNCHRONOUS[level] ?? String(level);
  if (init.role === 'checkpointer')
    return { db, writer: null, headSeq: 0, maxPageCount, synchronous, failedFence: -1 };
  if (init.durability === 'process' && init.walCheckpoints !== 'inline') {
    // Checkpoints (which fsync) are run by the checkpointer thread, not inside a commit here.
    db.pragma('wal_autocheckpoint = 0');
  }
  const headSeq = db.prepare(HEAD_SEQ_SQL).pluck().get() as number;
  return {
    db,
    writer: new BatchWriter(db, { roomCacheSize: init.roomCacheSize }),
    headSeq,
    maxPageCount,
    synchronous,
    failedFence: -1,
  };
}

export function executeOp(w: OpenedWriter, req: WriterOp): WriterResult {
  switch (req.op) {
    case 'append':
      return { outcomes: append(w, req.events, req.fence) };
    case 'cursor':
      (w.writer as BatchWriter).setCursor(req.name, req.seq, req.ts);
      return {};
    case 'save_state':
      (w.writer as BatchWriter).setCheckpoint(req.checkpoint, req.ts);
      return {};
    case 'prune_rooms':
      return { pruned: (w.writer as BatchWriter).pruneRooms(req.cutoffTs, req.limit) };
    case 'prune_named_rooms':
      return { pruned: (w.writer as BatchWriter).pruneNamedRooms(req.rooms, req.upToSeq) };
    case 'prune_seqs':
      return { pruned: { rooms: 0, events: (w.writer as BatchWriter).pruneSeqs(req.seqs) } };
    case 'prune_events':
      return {
        pruned: {
          rooms: 0,
          events: (w.writer as BatchWriter).pruneEvents(req.cutoffTs, req.limit),
        },
      };
    case 'pack_rooms':
      return {
        packed: (w.writer as BatchWriter).packRooms(
          req.cutoffTs,
          req.limit,
          req.afterKey,
          req.whole,
        ),
      };
    case 'checkpoint':
      w.db.pragma('wal_checkpoint(PASSIVE)');
      return {};
    case 'close':
      w.db.close();
      return {};
    case 'limit_pages':
      w.db.pragma(`max_page_count = ${req.pages ?? w.maxPageCount}`);
      return {};
    case 'crash':
      // Only the writer thread acts on this (writer-thread.ts); never on the main thread.
      throw new JournalError('JOURNAL_WRITE_FAILED', 'crash is a drill for the writer thread only');
  }
}

/**
 * One batch, unless a batch handed over before it failed (per-page disk-full can refuse a big
 * batch and take a smaller one after it): that one's successors wait for the commit queue to
 * learn of the failure and hand them over again, in their order.
 */
function append(w: OpenedWriter, events: PendingEvent[], fence: number): Outcome[] {
  if (fence <= w.failedFence) {
    throw new JournalError(
      'JOURNAL_WRITE_FAILED',
      'not committed: a commit handed over before it failed; retry it with the same eventId',
    );
  }
  try {
    return (w.writer as BatchWriter).append(events);
  } catch (err) {
    w.failedFence = fence;
    throw err;
  }
}

/** `{ code, message }` for crossing a thread; SQLite's corruption codes become JOURNAL_CORRUPT. */
export function toPlainError(err: unknown, path: string): { code: string; message: string } {
  const e = classifySqliteError(err, path);
  if (e instanceof JournalError) return e.toJSON();
  const code = (e as { code?: unknown })?.code;
  return {
    code: 'JOURNAL_WRITE_FAILED',
    message: `${typeof code === 'string' ? `${code}: ` : ''}${(e as Error)?.message ?? String(e)}`,
  };
}
