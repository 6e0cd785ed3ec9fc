/**
 * Which committed events an engine acts on when they arrive, and which only keep its copy of the
 * room in step: the second kind go to it lazy (bus/outbox.ts), in the next frame that goes to it
 * anyway — a lone room moves 4 frames fewer (docs/critical-path.md, "What bounds a lone room").
 */
import type { JournalEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';

/** Events of a room that start or stop no engine's work: another engine's progress, or its own echoed. */
const PROGRESS: ReadonlySet<string> = new Set([
  'room.prefill_started',
  'room.bootstrap_started',
  'room.transfer_posted',
  'room.decode_started',
]);

/**
 * Whether `engine` acts on `ev` of `room` (folded with it) when it arrives: what starts or stops
 * its work, or frees its pages (a peer's release, rule 7). The rest — progress, and anything once
 * its own release is committed — only keeps its copy of the room in step, and is sent lazy
 * (bus/outbox.ts): in the next frame that goes to it anyway, or within LAZY_MS.
 */
export function actsOn(engine: string, room: Room, ev: JournalEvent): boolean {
  if (room.releasedBy.includes(engine)) return false;
  if (PROGRESS.has(ev.type)) return false;
  return ev.type !== 'room.released' || ev.engine !== engine;
}
