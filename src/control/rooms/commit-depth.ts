/**
 * How many commits lie in sequence between a request and its first token (docs/critical-path.md,
 * "How the bench counts sequential commits"). `room.created` has depth 1; an engine's append names
 * the committed event whose arrival started the work it reports (`cause`, docs/protocol.md), and
 * is one deeper than that event. Since protocol 9 the prefill engine draws the first token, so a
 * room's first token counts the depth of the event its prefill engine started on, recorded when
 * `room.prefill_started` commits: 1 for a room with a reservation (`room.created`). Before it, the
 * decode engine's start counted: a lone room under protocol 5 showed 3 (`room.created` →
 * `room.bootstrapped` → `room.transfer_completed`), under protocol 7 2.
 */
import type { JournalEvent } from '../../room/events.ts';

/** Depths counted one by one; a first token behind more commits than this is counted here. */
export const MAX_COUNTED_DEPTH = 8;

interface Depths {
  /** Depths of the room's committed events, by seq. */
  bySeq: Map<number, number>;
  /** The cause of each engine append on its way to the journal, by its journal event id. */
  causes: Map<string, number>;
}

export class CommitDepth {
  private readonly rooms = new Map<string, Depths>();
  /** Rooms by the commits behind their first token: `[d]` rooms at depth d (the last: d or more). */
  readonly firstTokens: number[] = new Array<number>(MAX_COUNTED_DEPTH + 1).fill(0);

  /** An engine's append arrived (`eventId`: the id it will be journaled under). */
  arrived(room: string, eventId: string, cause: number | undefined): void {
    if (cause !== undefined) this.rooms.get(room)?.causes.set(eventId, cause);
  }

  /** A room event committed. */
  committed(ev: JournalEvent): void {
    if (ev.room === null) return;
    if (ev.type === 'room.created') {
      this.rooms.set(ev.room, { bySeq: new Map([[ev.seq, 1]]), causes: new Map() });
      return;
    }
    const r = this.rooms.get(ev.room);
    const cause = r?.causes.get(ev.eventId);
    if (!r || cause === undefined) return;
    r.causes.delete(ev.eventId);
    const behind = r.bySeq.get(cause);
    if (behind === undefined) return;
    r.bySeq.set(ev.seq, behind + 1);
    if (ev.type !== 'room.prefill_started') return;
    const i = Math.min(behind, MAX_COUNTED_DEPTH);
    this.firstTokens[i] = (this.firstTokens[i] as number) + 1;
  }

  /** The room ended: nothing more of it is counted. */
  forget(room: string): void {
    this.rooms.delete(room);
  }
}
