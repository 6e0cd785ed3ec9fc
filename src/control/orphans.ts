/**
 * Startup replay: rooms the journal shows in flight belonged to a control plane that died with
 * their clients' connections. They are loaded into the room book, then failed
 * (`orphaned_by_restart`, in the stage they were in); engines that survived free their pages
 * when the failure reaches them.
 */
import type { Room } from '../journal/reducer.ts';
import { LIVE_STATES } from '../journal/states.ts';
import type { JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';

/** Every room the journal shows in flight. */
export async function roomsInFlight(journal: Pick<JournalStore, 'rooms'>): Promise<Room[]> {
  const rooms: Room[] = [];
  let cursor: string | undefined;
  do {
    const page = await journal.rooms({ state: [...LIVE_STATES], limit: 10_000, cursor });
    rooms.push(...page.rooms);
    cursor = page.nextCursor ?? undefined;
  } while (cursor);
  return rooms;
}

/** Fails the orphans and journals the recovery action; returns how many there were. */
export async function failOrphans(
  journal: Pick<JournalStore, 'append'>,
  orphans: readonly Room[],
  log: Logger,
): Promise<number> {
  await Promise.all(
    orphans.map((r) =>
      journal
        .append({
          type: 'room.failed',
          room: r.room,
          source: 'control',
          eventId: `${r.room}:orphaned`,
          data: { reason: 'orphaned_by_restart', stage: r.state, detectedBy: 'control' },
        })
        .catch((err) => log.error({ err, room: r.room }, 'could not fail an orphaned room')),
    ),
  );
  if (orphans.length === 0) return 0;
  log.warn({ rooms: orphans.length }, 'failed rooms left in flight by the previous control plane');
  await journal.append({
    type: 'recovery.action',
    source: 'control',
    data: {
      action: 'fail_orphaned_rooms',
      reason: 'control plane restarted',
      outcome: `${orphans.length} rooms failed`,
    },
  });
  return orphans.length;
}
