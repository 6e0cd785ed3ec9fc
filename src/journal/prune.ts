/**
 * Retention's one algorithm, shared by every backend: delete whole terminal rooms past the room
 * horizon, then events of no room past the events horizon, each chunk a transaction of its own.
 * The loop awaits between chunks, so a control plane's appends take their turn on the writer
 * after each one: a prune of a million rooms never holds the writer for longer than a chunk.
 */
import type { JournalEvent } from '../room/events.ts';
import type { ArchiveChunk, PruneOptions, PruneResult } from './store.ts';

/**
 * Events of no room that are kept past the events horizon: a control plane rebuilds its engines'
 * pools, prefix index and cordons, and its tenants and their keys, from them at start. Few: one
 * per engine start or control plane start, per cordon, and per tenant change.
 */
export const KEPT_TYPES = [
  'engine.registered',
  'engine.cordoned',
  'engine.uncordoned',
  'tenant.added',
  'tenant.key_rotated',
  'tenant.revoked',
] as const;

/** `KEPT_TYPES` as an SQL list, for `type NOT IN (…)`. */
export function keptTypes(): string {
  return KEPT_TYPES.map((t) => `'${t}'`).join(', ');
}

/** One backend's single-transaction steps; `pruneInChunks` runs them. */
export interface PruneSteps {
  /** Up to `limit` whole terminal rooms that ended before `cutoffTs`: rooms and events deleted. */
  rooms(cutoffTs: number, limit: number): Promise<{ rooms: number; events: number }>;
  /**
   * Up to `limit` events before `cutoffTs` that belong to no room in `rooms` (engine and system
   * events, and rejection records of rooms that never existed), `KEPT_TYPES` excepted.
   */
  others(cutoffTs: number, limit: number): Promise<number>;
  /** With an archive: each chunk read first, archived, then deleted exactly as read. */
  archiving: ArchivingSteps;
}

export interface ArchivingSteps {
  /** Up to `limit` rooms `rooms` would delete, with every event of theirs, and the head seq then. */
  pickRooms(cutoffTs: number, limit: number): Promise<{ chunk: ArchiveChunk; upToSeq: number }>;
  /**
   * Deletes these rooms and their events, each only if no event of it is newer than `upToSeq`
   * (one that came after it was read waits for the next chunk, to be archived with it).
   */
  deleteRooms(rooms: string[], upToSeq: number): Promise<{ rooms: number; events: number }>;
  /** Up to `limit` events `others` would delete. */
  pickOthers(cutoffTs: number, limit: number): Promise<JournalEvent[]>;
  deleteEvents(seqs: number[]): Promise<number>;
}

/** Events of no room deleted per transaction, for each room a rooms' chunk may hold. */
const EVENTS_PER_ROOM = 10;

/**
 * Runs the steps chunk by chunk and hands what was deleted to `record` (the backend journals
 * `journal.pruned`) — also when a chunk fails midway, so that no gap goes unexplained.
 */
export async function pruneInChunks(
  opts: PruneOptions & { chunkRooms: number },
  steps: PruneSteps,
  record: (result: PruneResult) => Promise<void>,
): Promise<PruneResult> {
  const result: PruneResult = {
    cutoffTs: opts.cutoffTs,
    eventsCutoffTs: opts.eventsCutoffTs ?? null,
    rooms: 0,
    events: 0,
    otherEvents: 0,
    batches: 0,
    archived: opts.archive !== undefined,
  };
  const stopped = () => opts.signal?.aborted === true;
  let first = true;
  const next = async () => {
    if (!first) await opts.pause?.();
    first = false;
    return !stopped();
  };
  const { archive } = opts;
  const rooms = async (): Promise<{ rooms: number; events: number } | null> => {
    if (!archive) {
      const chunk = await steps.rooms(opts.cutoffTs, opts.chunkRooms);
      return chunk.rooms === 0 ? null : chunk;
    }
    const picked = await steps.archiving.pickRooms(opts.cutoffTs, opts.chunkRooms);
    if (picked.chunk.rooms.length === 0) return null;
    await archive(picked.chunk);
    const names = picked.chunk.rooms.map((r) => r.room);
    return steps.archiving.deleteRooms(names, picked.upToSeq);
  };
  const others = async (cutoffTs: number, limit: number): Promise<number | null> => {
    if (!archive) {
      const deleted = await steps.others(cutoffTs, limit);
      return deleted === 0 ? null : deleted;
    }
    const events = await steps.archiving.pickOthers(cutoffTs, limit);
    if (events.length === 0) return null;
    await archive({ rooms: [], events });
    return steps.archiving.deleteEvents(events.map((e) => e.seq));
  };
  const { eventsCutoffTs } = opts;
  try {
    while (await next()) {
      const chunk = await rooms();
      if (chunk === null) break;
      result.rooms += chunk.rooms;
      result.events += chunk.events;
      result.batches += 1;
      opts.onChunk?.({ ...result });
    }
    const limit = opts.chunkRooms * EVENTS_PER_ROOM;
    while (eventsCutoffTs !== undefined && (await next())) {
      const deleted = await others(eventsCutoffTs, limit);
      if (deleted === null) break;
      result.otherEvents += deleted;
      result.batches += 1;
      opts.onChunk?.({ ...result });
    }
  } catch (err) {
    await record(result).catch(() => {});
    throw err;
  }
  await record(result);
  return result;
}
