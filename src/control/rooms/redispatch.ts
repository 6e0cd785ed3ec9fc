/**
 * The one path by which a request goes on in a new room after its room ended — a migration's or
 * a move's continuation (migration.ts), or a retried request's: it waits up to `waitMs` for a pair
 * of usable engines with the pages free, creates the room there through intake, and otherwise
 * answers the client with why none came.
 */
import type { RoomRequest } from '../../bus/protocol.ts';
import type { JournalLog } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import type { ModelInfo } from '../../model/executor.ts';
import type { Clock } from '../../ports/clock.ts';
import type { EngineSession } from '../engines/engine-session.ts';
import { ControlError } from '../errors.ts';
import type { Intake } from '../intake/intake.ts';
import { RoomEndedError, type RoomStream } from '../intake/streams.ts';

/** What a continuation needs of the control plane. */
export interface RedispatchDeps {
  readonly journal: Pick<JournalLog, 'append'>;
  readonly model: ModelInfo;
  readonly log: Logger;
  /** Finds a pair with the pages free and journals the continuation's `room.created`. */
  readonly intake: Pick<Intake, 'pairFor' | 'create'>;
  closing(): boolean;
  readonly clock: Clock;
}

/** A request to go on in a new room. */
export interface Continuation {
  /** The room it leaves (migrated, or failed). */
  from: string;
  /** The new room's id. */
  to: string;
  stream: RoomStream;
  next: RoomRequest;
  /** Engines the new room may be on. */
  usable: (s: EngineSession) => boolean;
  /** What happened to `from`, for the record when no pair comes. */
  why: string;
  how: { as: 'migration' | 'move' } | { as: 'retry'; retriedFrom: string; otherwise: () => void };
}

/** Creates the continuation's room once a pair of its usable engines is free (or gives up). */
export async function redispatch(
  host: RedispatchDeps,
  waitMs: number,
  { from, to, stream, next, usable, why, how }: Continuation,
): Promise<void> {
  const retry = how.as === 'retry' ? how : null;
  const tokens = host.model.contextTokens(next).length;
  const deadline = host.clock.now() + waitMs;
  for (;;) {
    if (host.closing() || stream.done) return;
    if (stream.cancelled) {
      // The client left while its request waited for a pair: nothing to continue.
      stream.fail(new RoomEndedError(from, 'aborted', 'client_disconnect'));
      return;
    }
    const { pair } = host.intake.pairFor(tokens, next.maxTokens, usable);
    if (pair) {
      stream.continueIn(to, how.as);
      host.intake.create(
        stream,
        to,
        next,
        tokens,
        pair,
        retry
          ? { source: 'retry', retriedFrom: retry.retriedFrom }
          : { source: 'migration', migratedFrom: from },
      );
      return;
    }
    if (host.clock.now() > deadline) {
      host.log.error(
        { room: from, to, requestId: stream.trace.requestId },
        retry
          ? 'no other engine pair to try the request on'
          : 'no healthy engine pair to migrate to',
      );
      host.journal
        .append({
          type: 'recovery.action',
          room: from,
          source: 'control',
          data: {
            action: retry ? 'retry_room' : 'migrate_room',
            reason: why,
            outcome: `failed: no healthy engine pair within ${waitMs} ms; ${to} never created`,
          },
        })
        .catch(() => {});
      if (retry) {
        retry.otherwise();
        return;
      }
      stream.fail(
        new ControlError(
          'CONTROL_NO_ENGINES',
          `room ${from} ${how.as === 'move' ? 'left a retiring engine' : 'lost its engine'} and no healthy pair was free to continue it`,
        ),
      );
      return;
    }
    await new Promise<void>((r) => host.clock.setTimeout(r, 50));
  }
}
