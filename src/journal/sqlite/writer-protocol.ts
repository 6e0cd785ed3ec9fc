/** Messages between the journal's main-thread face (journal.ts) and its writer thread. */
import type { PendingEvent } from '../events.ts';
import type { Outcome, PruneOutcome } from './batch-writer.ts';
import type { Durability } from './open.ts';

export interface WriterInit {
  path: string;
  durability: Durability;
  roomCacheSize: number;
  create: boolean;
}

export type WriterRequest =
  | { id: number; op: 'append'; events: PendingEvent[] }
  | { id: number; op: 'cursor'; name: string; seq: number; ts: number }
  | { id: number; op: 'prune'; cutoffTs: number; chunkRooms: number }
  | { id: number; op: 'close' };

export type WriterReply =
  | { op: 'ready'; headSeq: number; schemaVersion: number }
  | { op: 'open_failed'; error: { code: string; message: string } }
  | { id: number; ok: true; outcomes?: Outcome[]; prune?: PruneOutcome }
  | { id: number; ok: false; error: { code: string; message: string } };
