/**
 * Migration: when an engine's process is gone (it exited, or came back as a new incarnation),
 * every live room on it whose client is still reading continues on a healthy pair. The old room
 * ends `migrated` and a new room takes the request's prompt plus the text already streamed, so
 * the client's stream goes on unbroken. Past the migration limit the room fails instead
 * (`migration_limit_reached`). Terminal rooms the lost engine never released are released for it.
 *
 * Retry is its sibling: a room that failed before any token reached its client, for a reason
 * another pair may not share (reasons.ts `FAILURE_BLAME`), is continued the same way as a new
 * room (`retriedFrom`) on a pair without the engine to blame, up to `retryLimit` times a request.
 * The client sees one answer; none of the failed room's reached it, so none is sent twice.
 *
 * An engine being retired is alive: only its rooms whose prefill has not begun move, so that its
 * drain does not wait on a queue (`moveQueued`), and it releases them itself.
 *
 * What becomes of each room is decided in loss.ts (pure: given/when/then tests); this module does
 * it — the room book holds the rooms, streams and requests, this module journals, moves the
 * stream, and creates the continuation room through redispatch.ts and intake.ts, as every room
 * is created.
 */

import type { RoomRequest } from '../../bus/protocol.ts';
import type { AppendResult } from '../../journal/store.ts';
import type { Ids } from '../../ports/ids.ts';
import type { EventData } from '../../room/events.ts';
import type { RoomMigrationReason } from '../../room/reasons.ts';
import type { Room } from '../../room/reducer.ts';
import { isTerminal } from '../../room/states.ts';
import { BoundedMap } from '../bounded-map.ts';
import type { EngineSession } from '../engines/engine-session.ts';
import { decideLoss, decideRetiring, decideRetry } from '../evidence/loss.ts';
import { RoomEndedError, type RoomStream } from '../intake/streams.ts';
import { type RedispatchDeps, redispatch } from './redispatch.ts';
import type { RoomBook } from './room-book.ts';

export interface MigrationOptions {
  /** Migrations per request; 0 turns migration off. */
  limit: number;
  /** How long a migrating (or retried) request waits for a healthy pair, in ms. */
  waitMs: number;
  /** Retries per request of a room that failed before its first token; 0 turns retry off. */
  retryLimit: number;
}

/** What migration needs of the control plane: the rooms, and the one path to a new room. */
export interface MigrationDeps extends RedispatchDeps {
  /** The rooms, their requests and client streams; migration moves a stream from room to room. */
  readonly book: Pick<
    RoomBook,
    'live' | 'room' | 'stream' | 'request' | 'takeStream' | 'returnStream'
  >;
  /** Names the room a request continues in. */
  readonly ids: Ids;
}

/** One lost engine process: which engine, which incarnation of it, and why it is gone. */
interface Loss {
  engine: string;
  incarnation: string;
  reason: string;
}

/** Why a room moves: its engine was lost (its release is journaled for it), or is being retired. */
interface Move {
  /** The engine it moves off. */
  engine: string;
  reason: RoomMigrationReason;
  /** What happened, in words, for `room.migrated.detail`. */
  detail: string;
  /** Engines the new room may be on. */
  usable: (s: EngineSession) => boolean;
  lost?: Loss;
}

/** Lost incarnations remembered (the oldest are forgotten): rooms committed late find theirs here. */
const LOST_KEPT = 256;
/** How often a lost engine's release the journal refused is tried again. */
const RELEASE_RETRY_MS = 1000;

export class Migrator {
  /** Incarnations lost (`engine/incarnation`), and how. */
  private readonly lost = new BoundedMap<string, Loss>(LOST_KEPT);

  constructor(
    private readonly host: MigrationDeps,
    private readonly options: MigrationOptions,
  ) {}

  /**
   * Moves the lost engine's live rooms whose clients still read, fails those past the limit, and
   * releases its terminal rooms. Resolves once the migrations are journaled (the new rooms follow
   * when a pair is free).
   */
  async engineLost(engine: string, incarnation: string, reason: string): Promise<void> {
    const { host } = this;
    if (host.closing()) return;
    const loss: Loss = { engine, incarnation, reason };
    this.lost.set(`${engine}/${incarnation}`, loss);
    const moves: Array<Promise<unknown>> = [];
    for (const r of host.book.live()) {
      if (r.prefillEngine !== engine && r.decodeEngine !== engine) continue;
      const move = this.lose(r, loss);
      if (move) moves.push(move);
    }
    await Promise.all(moves);
  }

  /**
   * A room's `room.created` committed after the incarnation it was admitted on was lost (it was on
   * its way to the journal when the engine went, so `engineLost` did not see it): it moves now,
   * as the lost engine's other rooms did, instead of waiting out its deadline.
   */
  created(room: Room, admittedOn: { prefill: string; decode: string }): Promise<unknown> | null {
    const loss =
      this.lost.get(`${room.prefillEngine}/${admittedOn.prefill}`) ??
      this.lost.get(`${room.decodeEngine}/${admittedOn.decode}`);
    return loss && !this.host.closing() ? this.lose(room, loss) : null;
  }

  /** What becomes of one room of a lost engine: released, failed, migrated, or left (null). */
  private lose(r: Room, loss: Loss): Promise<unknown> | null {
    const { host } = this;
    const stream = host.book.stream(r.room);
    const decided = decideLoss(r, stream, host.book.request(r.room), this.options.limit);
    switch (decided.kind) {
      case 'release':
        return this.releaseLost(r.room, loss);
      case 'leave':
        return null;
      case 'fail':
        return host.journal
          .append({
            type: 'room.failed',
            room: r.room,
            source: 'control',
            eventId: `${r.room}:migration-limit`,
            data: { reason: decided.reason, stage: r.state, detectedBy: 'control' },
          })
          .catch((err) => host.log.error({ err, room: r.room }, 'could not fail a room'));
      case 'migrate':
        return this.migrate(r, stream as RoomStream, decided.next, {
          engine: loss.engine,
          reason: 'engine_lost',
          detail: `${loss.engine} lost: ${loss.reason}`,
          usable: (s) => !(s.engine === loss.engine && s.incarnation === loss.incarnation),
          lost: loss,
        });
    }
  }

  /**
   * An engine being retired: its live rooms whose prefill has not begun (loss.ts
   * `decideRetiring`) move now to a pair without it, so that its drain waits only for the rooms
   * it is working on — a decode engine's rooms may wait seconds in an overloaded prefill engine's
   * queue. A room moves only while a pair has the pages for it; the others finish where they are.
   * The engine is alive and releases the moved rooms itself on their committed `room.migrated`.
   * Resolves with how many moved once their `room.migrated` are journaled.
   */
  async moveQueued(engine: string): Promise<number> {
    const { host } = this;
    const usable = (s: EngineSession) => s.engine !== engine;
    const on = [...host.book.live()].filter(
      (r) => r.prefillEngine === engine || r.decodeEngine === engine,
    );
    let moved = 0;
    for (const r of on) {
      if (host.closing()) break;
      const stream = host.book.stream(r.room);
      const next = decideRetiring(r, stream, host.book.request(r.room), this.options.limit);
      if (!next || !stream || !this.firstWithPair(next, [new Set()], usable)) continue;
      const detail = `${engine} retiring; its prefill had not begun`;
      const move: Move = { engine, reason: 'engine_retiring', detail, usable };
      if (await this.migrate(r, stream, next, move)) moved++;
    }
    return moved;
  }

  /** Moves the room's request and stream to a new room; true once its `room.migrated` commits. */
  private async migrate(
    from: Room,
    stream: RoomStream,
    next: RoomRequest,
    move: Move,
  ): Promise<boolean> {
    const { host } = this;
    const to = this.host.ids.room();
    // The stream leaves the old room before its terminal event is folded, so that ending it does
    // not end the client's stream.
    host.book.takeStream(from.room);
    let status: AppendResult['status'] | 'unavailable';
    try {
      const res = await host.journal.append({
        type: 'room.migrated',
        room: from.room,
        source: 'control',
        eventId: `${from.room}:migrated`,
        data: { toRoom: to, reason: move.reason, detail: move.detail, tokens: stream.tokens },
      });
      status = res.status;
    } catch (err) {
      host.log.error({ err, room: from.room }, 'could not journal room.migrated');
      status = 'unavailable';
    }
    if (status !== 'applied') {
      // It ended first (its end was committing when the engine went), or the journal refused:
      // the stream ends as the room did — a room that completed answers its client whole. A
      // room that was only to move off a retiring engine goes on where it is.
      if (host.book.returnStream(from.room, stream)) return false;
      const ended = host.book.room(from.room);
      if (ended && isTerminal(ended.state)) stream.endAs(ended);
      else
        stream.fail(
          new RoomEndedError(from.room, 'failed', `${move.detail}; not migrated (${status})`),
        );
      return false;
    }
    if (move.lost) await this.releaseLost(from.room, move.lost);
    if (next.maxTokens <= 0) {
      stream.complete('length');
      return true;
    }
    // Not back to an engine a room of this request already failed on, where another pair allows:
    // all of them, else one of them (the bad-engine drill: a retry away from the corrupting prefill
    // engine lost its decode engine, migrated back onto the corrupting one, failed again, and
    // reached its client).
    const { leftOut } = stream;
    const spare =
      leftOut.size === 0
        ? leftOut
        : (this.firstWithPair(
            next,
            [leftOut, ...[...leftOut].map((e) => new Set([e]))],
            move.usable,
          ) ?? new Set());
    const usable = (s: EngineSession) => move.usable(s) && !spare.has(s.engine);
    const fields = {
      room: from.room,
      to,
      engine: move.engine,
      reason: move.reason,
      streamed: stream.tokens,
      requestId: stream.trace.requestId,
    };
    // A loss is news to on-call; a planned move is the planner doing its work.
    if (move.lost) host.log.warn(fields, 'migrating room');
    else host.log.info(fields, 'moving a room off a retiring engine');
    void redispatch(host, this.options.waitMs, {
      from: from.room,
      to,
      stream,
      next,
      usable,
      why: move.detail,
      how: { as: move.lost ? 'migration' : 'move' },
    });
    return true;
  }

  /**
   * A room that failed before its decode engine streamed a token to its client: its request goes
   * on as a new room on a pair without the engine to blame (after the first token its prefill
   * engine streamed, if it did), when the reason allows and the request has retries left. True
   * when it took the stream (the caller must not end it).
   */
  retry(room: Room, stream: RoomStream, request: RoomRequest | undefined): boolean {
    const { host } = this;
    const decided = decideRetry(room, stream, request, this.options.retryLimit);
    if (!decided || !request || host.closing()) return false;
    // Without the engines an earlier retry of this request left out too, where a pair allows. No
    // such pair now (one engine of a role, or every other one full): the client gets the failure
    // at once rather than after a wait.
    const { next } = decided;
    if (next.maxTokens <= 0) {
      // The first token, from its prefill engine, was every token the client asked for.
      host.log.info(
        { room: room.room, reason: decided.reason, requestId: stream.trace.requestId },
        'room failed after its client had every token it asked for; answered',
      );
      this.recordRecovery(room, {
        action: 'answer_complete',
        reason: decided.reason,
        outcome: 'not tried again: its client had every token it asked for',
        tokens: stream.tokens,
      });
      stream.complete('length');
      return true;
    }
    const leftOut = this.firstWithPair(
      next,
      decided.leaveOut.flatMap((c) =>
        stream.leftOut.size > 0 ? [new Set([...c, ...stream.leftOut]), c] : [c],
      ),
    );
    if (!leftOut) return false;
    for (const e of leftOut) stream.leftOut.add(e);
    const { reason } = decided;
    const usable = (s: EngineSession) => !leftOut.has(s.engine);
    const to = this.host.ids.room();
    host.log.warn(
      { room: room.room, to, reason, leftOut: [...leftOut], requestId: stream.trace.requestId },
      'room failed before its decode engine streamed; trying the request again on another pair',
    );
    this.recordRecovery(room, {
      action: 'retry_room',
      reason,
      outcome: `tried again as ${to}${leftOut.size > 0 ? `, without ${[...leftOut].join(' and ')}` : ''}`,
      toRoom: to,
      ...(stream.tokens > 0 ? { tokens: stream.tokens } : {}),
    });
    void redispatch(host, this.options.waitMs, {
      from: room.room,
      to,
      stream,
      next,
      usable,
      why: `${room.room} failed: ${reason}`,
      // The client is answered with the room's own failure when no pair takes the request.
      how: { as: 'retry', retriedFrom: room.room, otherwise: () => stream.endAs(room) },
    });
    return true;
  }

  /** Journals what became of a failed room (`recovery.action`, with the stage it failed in). */
  private recordRecovery(
    room: Room,
    data: Omit<EventData<'recovery.action'>, 'stage'> & { action: string },
  ): void {
    this.host.journal
      .append({
        type: 'recovery.action',
        room: room.room,
        source: 'control',
        data: { ...data, stage: room.failedStage ?? undefined },
      })
      .catch((err) =>
        this.host.log.error(
          { err, room: room.room, action: data.action },
          'could not journal a recovery action',
        ),
      );
  }

  /** The first of `choices` of engines to leave out that leaves a pair for the request now. */
  private firstWithPair(
    request: RoomRequest,
    choices: ReadonlyArray<ReadonlySet<string>>,
    usable: (s: EngineSession) => boolean = () => true,
  ): ReadonlySet<string> | null {
    const tokens = this.host.model.contextTokens(request).length;
    const fits = (c: ReadonlySet<string>) =>
      this.host.intake.pairFor(tokens, request.maxTokens, (s) => usable(s) && !c.has(s.engine))
        .pair !== null;
    return choices.find(fits) ?? null;
  }

  /**
   * A terminal room the lost engine never released: its pages went with its process, so the
   * control plane journals the release for it — which lets the surviving engine free its side
   * (no transfer can still be writing into it) and the room leave the live view. A release the
   * journal refused (a full disk) is tried again every `RELEASE_RETRY_MS` until it commits: no
   * one else would ever release it, and the room would stay in the live view for good.
   */
  private async releaseLost(room: string, loss: Loss): Promise<void> {
    const { host } = this;
    const r = host.book.room(room);
    if (!r || r.releasedBy.includes(loss.engine) || host.closing()) return;
    try {
      await host.journal.append({
        type: 'room.released',
        room,
        engine: loss.engine,
        source: 'control',
        eventId: `${room}:released:${loss.engine}:${loss.incarnation}`,
        data: {},
      });
    } catch (err) {
      host.log.error(
        { err, room, engine: loss.engine, retryInMs: RELEASE_RETRY_MS },
        'could not release a lost engine’s room; trying again',
      );
      host.clock.setTimeout(() => void this.releaseLost(room, loss), RELEASE_RETRY_MS).unref();
    }
  }
}
