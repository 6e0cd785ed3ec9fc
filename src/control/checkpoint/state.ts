/**
 * What a control plane rebuilds at start that no projection of the journal keeps: the prefix
 * index (routing/prefix-index.ts), the registration each engine's current pool began with (the
 * page map's start: pages/page-map.ts), each engine's last registration (what a hello is checked
 * against: engine-link.ts) and the cordons (cordons.ts). Rooms in flight come from
 * the `rooms` projection and consumers' cursors from their table, so they need no fold.
 *
 * It is a fold of committed events in seq order — the same at start (from a checkpoint, or from
 * nothing) as while serving — so a checkpoint of it at seq S plus the events after S is what the
 * whole journal would give.
 */

import { eachEvent, type JournalReader } from '../../journal/store.ts';
import type { JournalEvent, JournalEventOf } from '../../room/events.ts';
import { type Cordon, foldCordon } from '../evidence/cordons.ts';
import { INDEX_EVENTS, PrefixIndex } from '../routing/prefix-index.ts';

/** Event types the state folds. */
export const STATE_EVENTS = [...INDEX_EVENTS, 'engine.cordoned', 'engine.uncordoned'] as const;

export type Registration = JournalEventOf<'engine.registered'>;

export interface LastRegistration {
  incarnation: string;
  seq: number;
}

/**
 * What binds a checkpoint to the journal it was folded from (codec.ts): the last
 * `engine.registered` folded, by seq and event id. Retention keeps every registration (a start
 * rebuilds pools from them), so the event is there for as long as the checkpoint is of use; the
 * event at the checkpoint's own seq is not (format 2 bound to it, and a journal under `--retain`
 * then ignored its checkpoint once that room was pruned — found by the simulator's SQLite journal).
 */
export interface Anchor {
  seq: number;
  id: string;
}

export class StartState {
  /** The last registration folded (null: none yet). */
  anchor: Anchor | null = null;

  constructor(
    /** The last seq folded (0: none). */
    public seq = 0,
    readonly index = new PrefixIndex(),
    readonly cordons = new Map<string, Cordon>(),
    /** Each engine's registration its current pool began with (the first of its incarnation). */
    readonly pools = new Map<string, Registration>(),
    /** Each engine's last registration. */
    readonly registered = new Map<string, LastRegistration>(),
  ) {}

  /**
   * Folds one committed event into the cordons and pools (others only move `seq`). The index is
   * folded by whoever owns it: the router while serving, `foldJournal` at start.
   */
  fold(ev: JournalEvent): void {
    this.seq = ev.seq;
    if (ev.engine === null) return;
    if (ev.type === 'engine.cordoned' || ev.type === 'engine.uncordoned') {
      foldCordon(this.cordons, ev);
    } else if (ev.type === 'engine.registered') {
      // An engine says hello again to every new control plane, under the same incarnation.
      if (this.pools.get(ev.engine)?.data.incarnation !== ev.data.incarnation)
        this.pools.set(ev.engine, ev);
      this.registered.set(ev.engine, { incarnation: ev.data.incarnation, seq: ev.seq });
      this.anchor = { seq: ev.seq, id: ev.eventId };
    }
  }

  /** Folds the journal's events after `seq` through `untilSeq`; returns how many it folded. */
  async foldJournal(
    journal: Pick<JournalReader, 'tail' | 'readFrom'>,
    untilSeq: number,
  ): Promise<number> {
    let read = 0;
    await eachEvent(journal, { type: [...STATE_EVENTS], afterSeq: this.seq }, (ev) => {
      if (ev.seq > untilSeq) return false;
      read++;
      this.index.fold(ev);
      this.fold(ev);
      return ev.seq < untilSeq;
    });
    if (untilSeq > this.seq) this.seq = untilSeq;
    return read;
  }
}

/** The id of the journal's event at `seq`, or null when it holds none there (pruned). */
export async function eventIdAt(
  journal: Pick<JournalReader, 'readFrom'>,
  seq: number,
): Promise<string | null> {
  if (seq <= 0) return null;
  const [ev] = await journal.readFrom(seq - 1, 1);
  return ev?.seq === seq ? ev.eventId : null;
}
