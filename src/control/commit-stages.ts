/**
 * What the control plane does with each event the journal commits, as named stages in one declared
 * order (as fastify names its hooks): the room book folds the event first, then every stage of
 * `COMMIT_STAGES` runs in turn — those of `every` for any event, those of `room` for a room event
 * the book folded, those of `ended` for the event that ended its room. The order matters (an
 * engine hears of a commit before a listener counts it; a room tried again keeps its client's
 * stream open), and it is read here rather than inferred from a method's body.
 */
import type { Logger } from '../log.ts';
import type { Clock } from '../ports/clock.ts';
import type { JournalEvent } from '../room/events.ts';
import type { Room } from '../room/reducer.ts';
import type { TenantBook } from '../tenants/book.ts';
import type { Checkpointer } from './checkpoint/checkpointer.ts';
import type { EngineLink } from './engines/engine-link.ts';
import type { EngineRegistry } from './engines/registry.ts';
import { recordProgress } from './evidence/engine-health.ts';
import type { Aborts } from './intake/aborts.ts';
import type { PairHealth } from './intake/pairs.ts';
import type { Listeners } from './listeners.ts';
import type { Migrator } from './rooms/migration.ts';
import type { Folded } from './rooms/room-book.ts';
import type { Router } from './routing/router.ts';

export const COMMIT_STAGES = {
  /** For every committed event. */
  every: [
    /** A tenant added, its key rotated or revoked: the API's keys change now (src/tenants/). */
    'tenants',
    /** The router folds it into the prefix index (routing/router.ts). */
    'route',
    /** The checkpointer counts it towards the next state checkpoint. */
    'checkpoint',
  ],
  /** For a room event the book folded (the reducer took it). */
  room: [
    /** An engine's event that moved its room is progress of that engine (stall evidence). */
    'progress',
    /** The room's engines hear of the commit (engine-link.ts). */
    'deliver',
    /** The room listeners: metrics, canaries, drills. */
    'listeners',
    /** Pairs whose KV could not move lately are passed over (intake/pairs.ts). */
    'pair-health',
    /** The abort workflow (intake/aborts.ts). */
    'aborts',
    /** A room admitted here: migration watches the incarnations it was admitted on. */
    'admitted',
  ],
  /** For the event that ended its room (its first terminal state). */
  ended: [
    /** The abort workflow lets the room go. */
    'let-go',
    /** A room that failed before its first token is tried again; its stream stays open. */
    'retry',
    /** The client's stream ends as the room did. */
    'end-stream',
  ],
} as const;

type Every = (typeof COMMIT_STAGES.every)[number];
type OfRoom = (typeof COMMIT_STAGES.room)[number];
type OfEnded = (typeof COMMIT_STAGES.ended)[number];

/** The ended room as its stages see it. */
export type Ended = Folded & { ended: NonNullable<Folded['ended']> };

/** Each stage's body; an `ended` stage that returns true has finished the room's end itself. */
export interface CommitStageBodies {
  every: Record<Every, (ev: JournalEvent, folded: Folded | null) => void>;
  room: Record<OfRoom, (ev: JournalEvent, folded: Folded) => void>;
  ended: Record<OfEnded, (ev: JournalEvent, folded: Ended) => boolean | undefined>;
}

/** Runs the stages for one committed event, `folded` being what the book made of it. */
export function runCommitStages(
  bodies: CommitStageBodies,
  ev: JournalEvent,
  folded: Folded | null,
): void {
  for (const name of COMMIT_STAGES.every) bodies.every[name](ev, folded);
  if (!folded) return;
  for (const name of COMMIT_STAGES.room) bodies.room[name](ev, folded);
  if (!folded.ended) return;
  const ended = folded as Ended;
  for (const name of COMMIT_STAGES.ended) if (bodies.ended[name](ev, ended)) return;
}

/** The parts the stages hand each commit to. */
export interface CommitParts {
  tenants: TenantBook;
  router: Router;
  /** Null until the checkpointer starts (after the journal's replay). */
  checkpoints: () => Checkpointer | null;
  registry: EngineRegistry;
  clock: Clock;
  link: EngineLink;
  roomEvents: Listeners<[before: Room | null, after: Room, ev: JournalEvent]>;
  pairHealth: PairHealth;
  aborts: Aborts;
  migrator: Migrator;
  log: Logger;
}

/** What each stage does, with the control plane's parts. */
export function commitStages(p: CommitParts): CommitStageBodies {
  return {
    every: {
      tenants: (ev) => p.tenants.apply(ev),
      route: (ev, folded) => p.router.fold(ev, folded?.ended != null),
      checkpoint: (ev) => p.checkpoints()?.folded(ev),
    },
    room: {
      progress: (ev, { before, room }) => {
        const s = ev.engine === null ? undefined : p.registry.get(ev.engine);
        if (s && room.state !== before?.state) recordProgress(s, p.clock.now());
      },
      deliver: (ev, { room }) => p.link.deliver(room, ev),
      listeners: (ev, { before, room }) => p.roomEvents.emit(before, room, ev),
      'pair-health': (ev, { room }) => p.pairHealth.fold(room, ev),
      aborts: (ev, { room }) => p.aborts.onCommitted(room, ev),
      admitted: (_ev, { room, admittedOn }) => {
        if (admittedOn) void p.migrator.created(room, admittedOn);
      },
    },
    ended: {
      'let-go': (_ev, { room }) => {
        p.aborts.onTerminal(room.room);
        return false;
      },
      retry: (_ev, { room, ended }) =>
        ended.stream !== undefined && p.migrator.retry(room, ended.stream, ended.request),
      'end-stream': (_ev, { room, ended }) => {
        const missing = ended.stream?.endAs(room);
        if (missing)
          p.log.error(
            { room: room.room, engine: room.decodeEngine, missing },
            'room completed with tokens missing from its stream',
          );
        return false;
      },
    },
  };
}
