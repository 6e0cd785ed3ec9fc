/**
 * Startup replay: rooms the journal shows in flight belonged to a control plane that died with
 * their clients' connections. They are loaded into the room book, then failed
 * (`orphaned_by_restart`, in the stage they were in); engines that survived free their pages
 * when the failure reaches them.
 *
 * Rooms that ended but that an engine has not released yet are loaded too: a release that was
 * on its way when the previous control plane died is sent again by its engine, and must find
 * its room (before, it was refused `not_owner` and never journaled); and the decode pages such a
 * room still holds are not reserved again (found by the simulator, `--faults control-kill`).
 */

import type { JournalLog, RoomFilter } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import type { Room } from '../../room/reducer.ts';
import { LIVE_STATES, TERMINAL_STATES } from '../../room/states.ts';

/**
 * How long before the journal's last event a room may have ended and still wait for a release:
 * an engine releases a room within milliseconds of its end, or of its transfer's deadline.
 */
export const RELEASE_WINDOW_MS = 5 * 60_000;

/** Every room the journal shows in flight. */
export function roomsInFlight(journal: Pick<JournalLog, 'rooms'>): Promise<Room[]> {
  return allRooms(journal, { state: [...LIVE_STATES] });
}

/** The rooms in flight (to fail), and with them the ended ones awaiting a release: all to load. */
export async function roomsLeft(
  journal: Pick<JournalLog, 'rooms' | 'headSeq' | 'readFrom'>,
): Promise<{ inFlight: Room[]; all: Room[] }> {
  const inFlight = await roomsInFlight(journal);
  return { inFlight, all: [...inFlight, ...(await roomsAwaitingRelease(journal))] };
}

/** Rooms that ended shortly before the journal's last event, and that an engine has not released. */
export async function roomsAwaitingRelease(
  journal: Pick<JournalLog, 'rooms' | 'headSeq' | 'readFrom'>,
): Promise<Room[]> {
  const head = await journal.headSeq();
  const [last] = head > 0 ? await journal.readFrom(head - 1, 1) : [];
  if (!last) return [];
  const ended = await allRooms(journal, {
    state: [...TERMINAL_STATES],
    since: last.ts - RELEASE_WINDOW_MS,
    unreleased: true,
  });
  return ended.filter(
    (r) => !r.releasedBy.includes(r.prefillEngine) || !r.releasedBy.includes(r.decodeEngine),
  );
}

async function allRooms(journal: Pick<JournalLog, 'rooms'>, filter: RoomFilter) {
  const rooms: Room[] = [];
  let cursor: string | undefined;
  do {
    const page = await journal.rooms({ ...filter, limit: 10_000, cursor, excludeOrigin: [] });
    rooms.push(...page.rooms);
    cursor = page.nextCursor ?? undefined;
  } while (cursor);
  return rooms;
}

/** The id of an orphan's failure: one however often it is tried (journal-outage.ts tries again). */
export const orphanedEventId = (room: string) => `${room}:orphaned`;

/**
 * Fails the orphans and journals the recovery action; returns the orphans whose failure the
 * journal refused. A journal that refuses writes (a full disk) does not stop the control plane
 * from starting (before, `pdctl serve` on a full disk with rooms left in flight exited at start:
 * found by the simulator): those orphans stay in the room book, and are failed once the journal
 * takes writes again (journal-outage.ts).
 */
export async function failOrphans(
  journal: Pick<JournalLog, 'append'>,
  orphans: readonly Room[],
  log: Logger,
): Promise<string[]> {
  const refused: string[] = [];
  await Promise.all(
    orphans.map((r) =>
      journal
        .append({
          type: 'room.failed',
          room: r.room,
          source: 'control',
          eventId: orphanedEventId(r.room),
          data: { reason: 'orphaned_by_restart', stage: r.state, detectedBy: 'control' },
        })
        .catch((err) => {
          refused.push(r.room);
          log.error(
            { err, room: r.room },
            'could not fail an orphaned room; it is failed once the journal takes writes',
          );
        }),
    ),
  );
  if (orphans.length === 0) return refused;
  log.warn({ rooms: orphans.length }, 'failed rooms left in flight by the previous control plane');
  await journal
    .append({
      type: 'recovery.action',
      source: 'control',
      data: {
        action: 'fail_orphaned_rooms',
        reason: 'control plane restarted',
        outcome:
          refused.length === 0
            ? `${orphans.length} rooms failed`
            : `${orphans.length - refused.length} rooms failed; ${refused.length} once the journal takes writes (it refused them)`,
      },
    })
    .catch((err) => log.error({ err }, 'could not journal the orphaned rooms’ recovery'));
  return refused;
}
