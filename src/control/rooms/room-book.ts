/**
 * The room book: everything the control plane knows of each room from its admission until both
 * engines have released it — the room as folded from committed events, the request behind it, the
 * client stream reading it, the KV pages promised to it on each engine, and its engines' appends
 * still on their way to a commit. Rooms that ended leave it, but their engines are remembered
 * (bounded) so that late events from them are still theirs.
 *
 * Every change goes through a few verbs — `admit`, `abandon`, `fold`, `project`/`settled`, and
 * the stream moves of a migration — so the rooms live on an engine are always the rooms that name
 * it, never a count kept by hand. No bus, no journal, no timers: `room-book.unit.test.ts` drives
 * it with events alone.
 */

import type { RoomRequest } from '../../bus/protocol.ts';
import { hop } from '../../hops.ts';
import type { JournalReader } from '../../journal/store.ts';
import { type Clock, systemClock } from '../../ports/clock.ts';
import type { JournalEvent, JournalEventOf, RoomReservation } from '../../room/events.ts';
import { type Room, reduce } from '../../room/reducer.ts';
import { isTerminal } from '../../room/states.ts';
import { BoundedMap } from '../bounded-map.ts';
import type { EngineAppend } from '../engines/engine-appends.ts';
import type { EngineSession } from '../engines/engine-session.ts';
import { releasedByBoth } from '../intake/aborts.ts';
import type { RoomStream } from '../intake/streams.ts';
import { PageLedger, roomPages } from '../pages/page-ledger.ts';
import { PageMap } from '../pages/page-map.ts';
import { CommitDepth } from './commit-depth.ts';

/** Ended rooms whose engines are remembered after they leave the book. */
export const ENDED_ROOMS_KEPT = 50_000;

/** The engines a room was given. */
export interface RoomOwners {
  readonly prefillEngine: string;
  readonly decodeEngine: string;
}

/** What folding one committed event did. */
export interface Folded {
  before: Room | null;
  room: Room;
  /**
   * The event ended the room (its first terminal state): its client stream and request, if any,
   * left the book with it.
   */
  ended: { stream: RoomStream | undefined; request: RoomRequest | undefined } | null;
  /** A `room.created` of a room admitted here: the engine incarnations it was admitted on. */
  admittedOn: { prefill: string; decode: string } | null;
}

/** A room admitted on a pair before its `room.created` commits. */
export interface Admitted {
  stream: RoomStream;
  request: RoomRequest;
  promptTokens: number;
  prefill: EngineSession;
  decode: EngineSession;
}

export class RoomBook {
  private readonly rooms = new Map<string, Room>();
  private readonly ended: BoundedMap<string, RoomOwners>;
  private readonly requests = new Map<string, RoomRequest>();
  private readonly streams = new Map<string, RoomStream>();
  /**
   * Rooms with engine appends on their way to a commit: the room as those appends leave it, so
   * that the next one from the same engine is judged after them, not before.
   */
  private readonly ahead = new Map<string, { room: Room; appends: number }>();
  /** Rooms admitted here whose `room.created` has not committed: the incarnations of their pair. */
  private readonly admitted = new Map<string, { prefill: string; decode: string }>();
  /** The rooms not yet ended that name each engine: admitted, or live in the fold. */
  private readonly onEngine = new Map<string, Set<string>>();
  /** KV pages promised to rooms per engine: admission counts pages, not rooms. */
  private readonly pages: PageLedger;
  /** The pages each decode engine holds for each room, folded from the journal (pages/page-map.ts). */
  private readonly decodePages = new PageMap();
  /** The commits in sequence behind each room's first token (commit-depth.ts). */
  private readonly depths = new CommitDepth();

  constructor(
    session: (engine: string) => EngineSession | undefined,
    private readonly clock: Clock = systemClock,
    endedKept = ENDED_ROOMS_KEPT,
  ) {
    this.ended = new BoundedMap(endedKept);
    this.pages = new PageLedger(session);
  }

  // ── reads ────────────────────────────────────────────────────────────────────────────────

  /** One room as folded; undefined before its `room.created` commits and once it left the book. */
  room(id: string): Room | undefined {
    return this.rooms.get(id);
  }

  /** Rooms in flight, and ended ones until both engines have released them. */
  live(): IterableIterator<Room> {
    return this.rooms.values();
  }

  /** The engines of a room while it is in the book, or recently ended: an engine appends only for its own. */
  owners(room: string): RoomOwners | undefined {
    return this.rooms.get(room) ?? this.ended.get(room);
  }

  /** The request behind a live room (sent to the prefill engine with its `room.created`). */
  request(room: string): RoomRequest | undefined {
    return this.requests.get(room);
  }

  /** The client stream reading a room; undefined when no client reads it (any more). */
  stream(room: string): RoomStream | undefined {
    return this.streams.get(room);
  }

  /** The rooms a client reads now. */
  streaming(): IterableIterator<string> {
    return this.streams.keys();
  }

  /** Takes every client stream out of the book (to end them all at shutdown). */
  takeAllStreams(): RoomStream[] {
    const all = [...this.streams.values()];
    this.streams.clear();
    return all;
  }

  /** Rooms not yet ended on this engine: admitted ones, and live ones the journal gave it. */
  liveOn(engine: string): number {
    return this.onEngine.get(engine)?.size ?? 0;
  }

  // ── what metrics and drills read ─────────────────────────────────────────────────────────

  /** Rooms by the journal commits in sequence behind their first token: index d counts d commits. */
  firstTokenCommits(): readonly number[] {
    return this.depths.firstTokens;
  }

  /** Pages a decode engine reserved while the page map still held them for another room. */
  get pageConflicts(): number {
    return this.decodePages.conflicts;
  }

  /** Pages the page map holds on a decode engine for rooms it has not released. */
  decodePagesOn(engine: string): number {
    return this.decodePages.heldOn(engine);
  }

  /** Which room the page map holds each page of a decode engine's pool for (its incarnation's). */
  decodePageOwners(engine: string): ReturnType<PageMap['holdings']> {
    return this.decodePages.holdings(engine);
  }

  // ── admission ────────────────────────────────────────────────────────────────────────────

  /**
   * The rooms the journal left (in flight, or ended and awaiting a release) at start, before any
   * engine says hello, and the decode pages they hold as of `untilSeq` in the `pools` each
   * engine's registration began (pages/page-map.ts).
   */
  async load(
    journal: Pick<JournalReader, 'tail'>,
    rooms: readonly Room[],
    untilSeq: number,
    pools: Iterable<JournalEventOf<'engine.registered'>> = [],
  ): Promise<void> {
    for (const r of rooms) {
      this.rooms.set(r.room, r);
      if (!isTerminal(r.state)) this.index(r.room, r, true);
    }
    await this.decodePages.rebuild(journal, rooms, untilSeq, pools);
  }

  /**
   * A room on its pair, before its `room.created` is appended: its stream and request are kept,
   * it counts on both engines, and the KV pages it will take are promised on each. Returns the
   * decode pages chosen for it, for its `room.created` (undefined: the decode engine chooses, as
   * when it does not say how its KV takes pages).
   */
  admit(room: string, a: Admitted): RoomReservation | undefined {
    this.streams.set(room, a.stream);
    this.requests.set(room, a.request);
    this.admitted.set(room, { prefill: a.prefill.incarnation, decode: a.decode.incarnation });
    this.index(room, { prefillEngine: a.prefill.engine, decodeEngine: a.decode.engine }, true);
    const need = (s: EngineSession) => roomPages(s, a.promptTokens, a.request.maxTokens);
    const d = a.decode;
    const count = need(d);
    this.pages.hold(room, a.prefill, need(a.prefill));
    this.pages.hold(room, d, count);
    const pages = count > 0 ? this.decodePages.reserve(room, d, count) : null;
    if (!pages) return undefined;
    return { decode: { pages, pool: d.pool, epoch: d.epoch, incarnation: d.incarnation } };
  }

  /**
   * The journal refused the admitted room's `room.created`: it never existed. Returns its
   * stream (taken out of the book) for the caller to fail.
   */
  abandon(room: string, owners: RoomOwners): RoomStream | undefined {
    this.index(room, owners, false);
    this.pages.releaseAll(room);
    this.decodePages.unreserve(room, owners.decodeEngine);
    this.requests.delete(room);
    this.admitted.delete(room);
    return this.takeStream(room);
  }

  // ── committed events ─────────────────────────────────────────────────────────────────────

  /**
   * Folds a committed room event (the one reducer of src/journal/reducer.ts). Null when the event
   * is not a room's or the reducer refuses it. A release frees the engine's pages; the room's
   * first terminal event ends its request and takes its stream out; once both engines have
   * released an ended room it leaves the book.
   */
  fold(ev: JournalEvent): Folded | null {
    hop('committed', ev.type, ev.room);
    this.decodePages.fold(ev);
    if (ev.room === null || ev.type === 'room.event_rejected') return null;
    const before = this.rooms.get(ev.room) ?? null;
    const r = reduce(before, ev);
    if (!r.ok) return null;
    const room = r.room;
    this.rooms.set(room.room, room);
    this.depths.committed(ev);
    const admittedOn = ev.type === 'room.created' ? (this.admitted.get(room.room) ?? null) : null;
    if (admittedOn) this.admitted.delete(room.room);
    if (ev.type === 'room.released' && ev.engine !== null) this.pages.release(room.room, ev.engine);
    let ended: Folded['ended'] = null;
    if (!isTerminal(room.state)) this.index(room.room, room, true);
    else if (!before || !isTerminal(before.state)) {
      this.index(room.room, room, false);
      ended = { stream: this.takeStream(room.room), request: this.requests.get(room.room) };
      this.requests.delete(room.room);
      this.depths.forget(room.room);
    }
    if (isTerminal(room.state) && releasedByBoth(room)) this.leave(room);
    return { before, room, ended, admittedOn };
  }

  // ── engine appends ───────────────────────────────────────────────────────────────────────

  /**
   * Whether the journal would take this event from this engine now, as far as the book knows —
   * the committed room plus the engine's appends still on their way (an engine sends
   * `prefill_started` and `transfer_posted` back to back). True also records it as on its way,
   * until `settled`, and when it arrived (under `eventId`, as it will be journaled) for the
   * commits behind the room's first token.
   */
  project(event: EngineAppend, engine: string, eventId: string): boolean {
    const ahead = this.ahead.get(event.room);
    const view = ahead?.room ?? this.rooms.get(event.room);
    if (!view) return false;
    const ev: JournalEvent = {
      ...event,
      seq: 0,
      ts: this.clock.now(),
      engine,
      source: `engine:${engine}`,
      eventId,
    };
    const r = reduce(view, ev);
    if (!r.ok) return false;
    this.depths.arrived(event.room, eventId, event.cause);
    this.ahead.set(event.room, { room: r.room, appends: (ahead?.appends ?? 0) + 1 });
    return true;
  }

  /** An append that `project` let through has committed or failed. */
  settled(room: string): void {
    const ahead = this.ahead.get(room);
    if (ahead && --ahead.appends <= 0) this.ahead.delete(room);
  }

  // ── client streams (migration moves one from room to room) ──────────────────────────────

  /** Takes the room's stream out of the book (a migration, or an answer the journal cannot record). */
  takeStream(room: string): RoomStream | undefined {
    const stream = this.streams.get(room);
    this.streams.delete(room);
    return stream;
  }

  /** Gives a taken stream back to a room that has not ended (its migration was not journaled). */
  returnStream(room: string, stream: RoomStream): boolean {
    const r = this.rooms.get(room);
    if (!r || isTerminal(r.state)) return false;
    this.streams.set(room, stream);
    return true;
  }

  private leave(room: Room): void {
    this.rooms.delete(room.room);
    this.pages.releaseAll(room.room);
    this.ended.set(room.room, {
      prefillEngine: room.prefillEngine,
      decodeEngine: room.decodeEngine,
    });
  }

  private index(room: string, owners: RoomOwners, on: boolean): void {
    for (const engine of [owners.prefillEngine, owners.decodeEngine]) {
      const set = this.onEngine.get(engine);
      if (on) {
        if (set) set.add(room);
        else this.onEngine.set(engine, new Set([room]));
      } else if (set) {
        set.delete(room);
        if (set.size === 0) this.onEngine.delete(engine);
      }
    }
  }
}
