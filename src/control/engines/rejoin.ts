/** What a hello reads from the journal (engine-link.ts): the events the engine missed. */
import type { EngineMessage } from '../../bus/protocol.ts';
import type { JournalLog } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import type { EngineSession } from './engine-session.ts';

export type Backlog = Awaited<ReturnType<JournalLog['engineBacklog']>>;

interface Deps {
  journal: Pick<JournalLog, 'engineBacklog'>;
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
