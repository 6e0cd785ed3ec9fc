/** Messages between the journal's main-thread face and its threads (writer or checkpointer). */

import type { PendingEvent } from '../../room/events.ts';
import type { Outcome } from '../decide.ts';
import type { CheckpointInput, Durability } from '../store.ts';
import type { PackPass } from './packs/packer.ts';

export interface WriterInit {
  path: string;
  durability: Durability;
  roomCacheSize: number;
  create: boolean;
  /** `writer` owns the writing connection; `checkpointer` only copies the WAL into the database. */
  role: 'writer' | 'checkpointer';
  /** The writer's precheck reads every page first (default); false: the journal scans it later. */
  scan?: boolean;
  /**
   * Process durability: who copies the WAL into the database. `thread` (default): a checkpointer
   * thread, so no commit waits on its fsync. `inline`: SQLite itself, in the commit that crosses
   * 1000 WAL pages — the simulator's, whose run must not wait on a thread.
   */
  walCheckpoints?: 'thread' | 'inline';
}

/** One unit of work for the writer, wherever it runs. */
export type WriterOp =
  /** `fence`: the commit queue's (BatchCommitter.commit); at or below a failed one's, refused. */
  | { op: 'append'; events: PendingEvent[]; fence: number }
  | { op: 'cursor'; name: string; seq: number; ts: number }
  /** A state checkpoint of the control plane (not SQLite's WAL checkpoint: `checkpoint`). */
  | { op: 'save_state'; checkpoint: CheckpointInput; ts: number }
  /** One transaction of retention each (journal/prune.ts runs them in turn). */
  | { op: 'prune_rooms'; cutoffTs: number; limit: number }
  | { op: 'prune_events'; cutoffTs: number; limit: number }
  /** With an archive: exactly what was read and archived. */
  | { op: 'prune_named_rooms'; rooms: string[]; upToSeq: number }
  | { op: 'prune_seqs'; seqs: number[] }
  /** One transaction of packing (packs/packer.ts): rooms that ended before `cutoffTs`. */
  | { op: 'pack_rooms'; cutoffTs: number; limit: number; afterKey: number; whole: boolean }
  | { op: 'checkpoint' }
  | { op: 'close' }
  /** Drills only: cap the database at `pages` pages (null: lift the cap), as a full disk would. */
  | { op: 'limit_pages'; pages: number | null }
  /** Drills only: the thread exits at once, as a crash would. */
  | { op: 'crash' };

export interface WriterResult {
  outcomes?: Outcome[];
  pruned?: { rooms: number; events: number };
  packed?: PackPass;
}

export type WriterRequest = WriterOp & { id: number };

export type WriterReply =
  | { op: 'ready'; headSeq: number; synchronous: string }
  | { op: 'open_failed'; error: { code: string; message: string } }
  | ({ id: number; ok: true } & WriterResult)
  | { id: number; ok: false; error: { code: string; message: string } };
