/**
 * What a hello reads from the journal (engine-link.ts): the events the engine missed, and whether
 * the process before it died while no control plane saw it go.
 */
import type { EngineMessage } from '../bus/protocol.ts';
import { eachEvent, type JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import type { EngineSession } from './engine-session.ts';

export type Backlog = Awaited<ReturnType<JournalStore['engineBacklog']>>;

interface Deps {
  journal: Pick<JournalStore, 'engineBacklog' | 'tail'>;
  log: Logger;
}

/** The engine's rooms' events after what it has applied; null (logged) when unreadable. */
export async function backlogFor(
  deps: Deps,
  session: EngineSession,
  msg: EngineMessage<'hello'>,
): Promise<Backlog | null> {
  // A process that applied nothing yet and just joined needs its live rooms; one reconnecting
  // needs everything of its rooms since it joined, whatever it applied.
  const joined = session.delivery.joinedSeq;
  const afterSeq = Math.max(msg.lastSeq, joined ?? 0);
  try {
    return await deps.journal.engineBacklog(
      msg.engine,
      afterSeq,
      joined === null && msg.lastSeq === 0,
    );
  } catch (err) {
    deps.log.error(
      { err, engine: msg.engine },
      'cannot read the engine’s backlog; it will say hello again',
    );
    session.delivery.buffer = [];
    return null;
  }
}

/**
 * The engine's last registration by a control plane before this one (`startSeq`: the journal's
 * head when this one started), for a hello this control plane has not welcomed yet:
 *
 * - Of another incarnation, when this control plane has no session of the engine: that process
 *   died unseen — while no control plane ran, or before this one started — and its rooms
 *   (moved, ended, or awaiting its release, which a surviving peer waits on before freeing its
 *   pages) are this control plane's to settle (found by the simulator, `--faults all` seed 41).
 * - Of this incarnation: the same process, reconnecting from the control plane before. It must
 *   get everything of its rooms since then, ended ones too, even if it applied no event yet
 *   (seed 5101: rooms created and failed while it was cut off never reached it).
 */
export async function registeredBefore(
  deps: Deps,
  engine: string,
  startSeq: number,
): Promise<{ incarnation: string; seq: number } | undefined> {
  let last: { incarnation: string; seq: number } | undefined;
  try {
    await eachEvent(deps.journal, { type: 'engine.registered', engine }, (ev) => {
      if (ev.seq > startSeq) return false;
      last = { incarnation: ev.data.incarnation, seq: ev.seq };
      return true;
    });
  } catch (err) {
    deps.log.error({ err, engine }, 'cannot read the engine’s registrations');
  }
  return last;
}
