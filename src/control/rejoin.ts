/**
 * What a hello reads from the journal (engine-link.ts): the events the engine missed, and whether
 * the process before it died while no control plane saw it go.
 */
import type { EngineMessage } from '../bus/protocol.ts';
import type { JournalStore } from '../journal/store.ts';
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
 * An engine this control plane had no session of registered (`registered`: the seq of its
 * `engine.registered`): if the journal's registration before this one is of another incarnation,
 * that process died unseen — while no control plane ran, or before this one started — and its
 * rooms (moved, ended, or awaiting its release, which a surviving peer waits on before freeing
 * its pages) are this control plane's to settle: returns that incarnation. A process that
 * reconnects to a new control plane was registered last under its own incarnation, and is left
 * alone. Found by the simulator (`--faults all` seed 41).
 */
export async function diedUnseen(
  deps: Deps,
  engine: string,
  current: string,
  registered: Promise<number>,
): Promise<string | undefined> {
  try {
    const seq = await registered;
    const recent = await deps.journal.tail({ type: 'engine.registered', engine, limit: 4 });
    const old = recent.find((e) => e.seq < seq)?.data.incarnation;
    return old !== undefined && old !== current ? old : undefined;
  } catch (err) {
    deps.log.error({ err, engine }, 'cannot read the engine’s registration before this one');
    return undefined;
  }
}
