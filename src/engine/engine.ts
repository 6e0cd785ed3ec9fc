/**
 * What both engine roles share: the engine's view of its rooms, rebuilt only from committed
 * events (in seq order, each applied once), the page allocator, and the release rule: each engine
 * appends exactly one `room.released` per room it was given, once it holds no pages or work for
 * it. The roles (prefill.ts, decode.ts) say how to react to an event; this file says when.
 */

import type { AppendAck } from '../bus/client.ts';
import type { ControlMessage, EngineMessage, RoomRequest } from '../bus/protocol.ts';
import { hop } from '../hops.ts';
import { IdleWaiters } from '../idle.ts';
import type { Logger } from '../log.ts';
import { type EngineModel, type FirstToken, pagesFor } from '../model/executor.ts';
import { type Clock, systemClock } from '../ports/clock.ts';
import { type Ids, systemIds } from '../ports/ids.ts';
import type {
  BANDS,
  EventData,
  JournalEvent,
  KvTransport,
  RoomEventType,
  RoomReservation,
} from '../room/events.ts';
import type { RoomFailureReason } from '../room/reasons.ts';
import { type Room, reduce } from '../room/reducer.ts';
import { isTerminal, type RoomState } from '../room/states.ts';
import { type Fault, parseFault } from '../transfer/core.ts';
import { PageAllocator } from './allocator.ts';
import type { EngineOptions } from './options.ts';

/** How an engine reaches the control plane (the bus client, or a fake in unit tests). */
export interface EnginePorts {
  append(eventId: string, event: EngineMessage<'append'>['event']): Promise<AppendAck>;
  tokens(msg: EngineMessage<'tokens'>): void;
  /** Say hello again (with our lastSeq): we missed an event and need the replay from there. */
  resync(): void;
}

/** What every engine is built from; the roles add their pools and transports. */
export interface EngineParts {
  opts: Readonly<EngineOptions>;
  ports: EnginePorts;
  model: EngineModel;
  log: Logger;
  /** Default: the process's clock; the simulator's is virtual (ports/clock.ts). */
  clock?: Clock;
  /** Event ids. Default: the process's (ports/ids.ts). */
  ids?: Ids;
}

export interface EngineRoom {
  view: Room;
  request: RoomRequest | null;
  /** Its tenant's band, from its `room.created`; null when it had none (an open API) or was not seen. */
  band: (typeof BANDS)[number] | null;
  /** Abort requested, terminal, or given up by this engine: no new work starts. */
  stopped: boolean;
  released: boolean;
  /** Pages in this engine's pool (a copy of what the allocator holds). */
  pages: number[] | null;
  /** Events since the room was given to this engine, for the role's bookkeeping. */
  transferDone: boolean;
  peerReleased: boolean;
  /**
   * Where the KV goes, from the committed `room.created`'s reservation (or, without one, the
   * committed `room.bootstrapped`), and (`peer`, attached by the control plane) the decode
   * engine's host and, when it can receive over UCX, its worker address. From then on the prefill
   * engine may write into those pages: the decode engine keeps them until the transfer completed
   * or the prefill engine released the room (docs/protocol.md, rule 7).
   */
  kvTarget: {
    pages: number[];
    pool: string;
    epoch: number;
    peer: ControlMessage<'event'>['kvPeer'] | null;
  } | null;
  /** The decode pages the control plane reserved in `room.created`; null: this engine chooses. */
  reservation: RoomReservation['decode'] | null;
  /** How `room.created` expected the pair to move the KV (control/intake/pairs.ts); null: not recorded. */
  transport: KvTransport | null;
  /**
   * The answer's first token as the committed `room.transfer_completed` names it (protocol 9):
   * what decode continues after; null when the model ended the text at once; undefined until
   * that commit (or in an event written before protocol 9).
   */
  firstToken: FirstToken | null | undefined;
  /**
   * The seq of the committed event this engine last started work on for the room (`react` said it
   * acted): its appends name it as their `cause`, so the control plane counts commits in sequence.
   */
  cause: number | null;
}

export type EngineState = 'starting' | 'ready' | 'draining' | 'stopped';

/** The `inject_fault` spec that hangs an engine's model compute (drills). */
export const COMPUTE_HANG = 'compute_hang';

export abstract class EngineCore {
  readonly rooms = new Map<string, EngineRoom>();
  readonly allocator: PageAllocator;
  lastSeq = 0;
  state: EngineState = 'starting';
  workTicks = 0;
  /** Transfers that completed (any status): the transfer path's tick counter. */
  transferTicks = 0;
  duplicates = 0;
  /** Events that did not follow the last one applied (a lost message): each led to a resync. */
  gaps = 0;
  /** Between noticing a gap and the welcome that answers our hello: events are dropped. */
  private resyncing = false;
  /** Events of the first replay still to arrive: applied without reacting (see onWelcome). */
  private replayLeft = 0;
  private welcomedOnce = false;
  private readonly idle: IdleWaiters;
  protected readonly opts: Readonly<EngineOptions>;
  protected readonly ports: EnginePorts;
  protected readonly model: EngineModel;
  protected readonly log: Logger;
  protected readonly clock: Clock;
  private readonly ids: Ids;

  constructor(parts: EngineParts) {
    this.opts = parts.opts;
    this.ports = parts.ports;
    this.model = parts.model;
    this.log = parts.log;
    this.clock = parts.clock ?? systemClock;
    this.ids = parts.ids ?? systemIds;
    this.idle = new IdleWaiters(this.clock);
    this.allocator = new PageAllocator(parts.opts.pages);
  }

  get id(): string {
    return this.opts.id;
  }

  /** Pages a new room could have now (what the heartbeat reports free). */
  freePages(): number {
    return this.allocator.free;
  }

  /** Rooms this engine still holds pages or work for: what hello reports. */
  heldRooms(): string[] {
    return [...this.rooms.values()].filter((r) => !r.released).map((r) => r.view.room);
  }

  /**
   * The first welcome of this process replays the history of the rooms the journal gives this
   * engine. A fresh process holds nothing, so it applies that history silently and then decides,
   * per room, whether it can carry on or must fail the room (`resume`). Later welcomes (a
   * reconnect) replay only what was missed, and those events are handled like live ones.
   */
  onWelcome(w: ControlMessage<'welcome'>): void {
    this.resyncing = false;
    if (this.welcomedOnce) {
      for (const chunks of this.sentChunks.values()) for (const c of chunks) this.ports.tokens(c);
      return;
    }
    this.welcomedOnce = true;
    this.state = 'ready';
    this.replayLeft = w.replayEvents;
    if (this.replayLeft === 0) this.resumeAll();
  }

  onEvent(msg: ControlMessage<'event'>): void {
    const ev = msg.event as JournalEvent;
    if (ev.seq <= this.lastSeq) {
      this.duplicates++;
      return;
    }
    if (this.resyncing) return;
    if (msg.prevSeq !== this.lastSeq) {
      // Something between our last event and this one was lost (a connection that died with
      // messages in it): ask for the replay from our last applied seq, and drop until it comes.
      this.gaps++;
      this.resyncing = true;
      this.log.warn(
        { lastSeq: this.lastSeq, prevSeq: msg.prevSeq, seq: ev.seq },
        'missed events; resyncing',
      );
      this.ports.resync();
      return;
    }
    this.lastSeq = ev.seq;
    const silent = this.replayLeft > 0;
    if (silent) this.replayLeft--;
    this.apply(ev, msg.request ?? null, silent, msg.kvPeer ?? null);
    if (silent && this.replayLeft === 0) this.resumeAll();
  }

  private apply(
    ev: JournalEvent,
    request: RoomRequest | null,
    silent: boolean,
    kvPeer: ControlMessage<'event'>['kvPeer'] | null,
  ): void {
    if (ev.room === null || !ev.type.startsWith('room.')) return;
    hop('engine-has', ev.type, ev.room);
    const r = this.rooms.get(ev.room);
    const reduced = reduce(r?.view ?? null, ev);
    if (!reduced.ok) {
      // A room this engine has finished with and forgotten: nothing to do.
      if (reduced.reason !== 'unknown_room') {
        this.log.warn(
          { room: ev.room, seq: ev.seq, reason: reduced.reason },
          'committed event does not fold onto this engine’s view of the room; ignored',
        );
      }
      return;
    }
    let room = r;
    if (!room) {
      const v = reduced.room;
      if (v.prefillEngine !== this.id && v.decodeEngine !== this.id) return;
      if (this.state === 'draining' && !silent) {
        this.rooms.set(ev.room, this.newRoom(v, request));
        this.fail(this.rooms.get(ev.room) as EngineRoom, 'engine_draining', v.state);
        return;
      }
      room = this.newRoom(v, request);
      this.rooms.set(ev.room, room);
      if (ev.type === 'room.created') room.band = ev.data.band ?? null;
    } else {
      room.view = reduced.room;
      if (request && !room.request) room.request = request;
    }
    this.track(room, ev, kvPeer);
    if (silent) return;
    if (ev.type === 'room.abort_requested' || isTerminal(room.view.state)) this.stop(room);
    else if (room.stopped) this.tryRelease(room);
    else {
      // Set before react runs: the appends it makes at once name this event too.
      const before = room.cause;
      room.cause = ev.seq;
      if (!this.react(room, ev)) room.cause = before;
    }
    this.forgetIfDone(room);
  }

  private newRoom(view: Room, request: RoomRequest | null): EngineRoom {
    return {
      view,
      request,
      band: null,
      stopped: false,
      released: false,
      pages: null,
      transferDone: false,
      peerReleased: false,
      kvTarget: null,
      reservation: null,
      transport: null,
      firstToken: undefined,
      cause: null,
    };
  }

  private track(
    room: EngineRoom,
    ev: JournalEvent,
    kvPeer: ControlMessage<'event'>['kvPeer'] | null,
  ): void {
    if (ev.type === 'room.created') {
      const r = ev.data.reservation?.decode ?? null;
      room.reservation = r;
      room.transport = ev.data.transport ?? null;
      // The reserved pages are where the KV goes from this commit on (protocol 7).
      if (r) room.kvTarget = { pages: r.pages, pool: r.pool, epoch: r.epoch, peer: kvPeer };
    } else if (ev.type === 'room.transfer_completed') {
      room.transferDone = true;
      room.firstToken = ev.data.firstToken;
    } else if (ev.type === 'room.released' && ev.engine !== this.id) room.peerReleased = true;
    else if (ev.type === 'room.bootstrapped' && room.kvTarget === null) {
      const d = ev.data;
      room.kvTarget = { pages: d.pages, pool: d.pool ?? '', epoch: d.epoch ?? 0, peer: kvPeer };
    }
  }

  private resumeAll(): void {
    for (const room of this.rooms.values()) {
      if (isTerminal(room.view.state) || room.view.abortRequestedAt !== null) {
        this.stop(room);
      } else {
        this.resume(room);
      }
      this.forgetIfDone(room);
    }
  }

  private forgetIfDone(room: EngineRoom): void {
    if (room.released && isTerminal(room.view.state)) {
      this.rooms.delete(room.view.room);
      this.sentChunks.delete(room.view.room);
    }
    if (this.state === 'draining') this.notifyIdle();
  }

  /**
   * Token chunks sent for each room, kept until the room ends: a chunk can die with a connection,
   * so after a welcome that is not the first they are sent again (the control plane keeps each
   * index once), ahead of the appends resent after them — a prefill engine's first token ahead of
   * its `room.transfer_completed`, a decode engine's chunks ahead of its `room.completed`.
   */
  private readonly sentChunks = new Map<string, EngineMessage<'tokens'>[]>();

  protected sendTokens(chunk: EngineMessage<'tokens'>): void {
    const kept = this.sentChunks.get(chunk.room);
    if (kept) kept.push(chunk);
    else this.sentChunks.set(chunk.room, [chunk]);
    hop('tokens-sent', null, chunk.room);
    this.ports.tokens(chunk);
  }

  /** The room ended, or its chunks can no longer matter: nothing to resend. */
  protected forgetTokens(room: string): void {
    this.sentChunks.delete(room);
  }

  /** What the role adds to a room's `room.released`. */
  protected releaseData(_room: EngineRoom): { speculativeTokens?: number } {
    return {};
  }

  /** A room's KV arrived, before its commit (decode engines act on it; docs/protocol.md). */
  onKvArrived(_msg: ControlMessage<'kv_arrived'>): void {}

  /** React to a committed event of a live room; true when it started work on it. */
  protected abstract react(room: EngineRoom, ev: JournalEvent): boolean;
  /** After a restart's replay: carry on with a live room, or fail it. */
  protected abstract resume(room: EngineRoom): void;
  /** Stop the room's work (abort or terminal); call `tryRelease` when nothing is left running. */
  protected abstract stop(room: EngineRoom): void;
  /** Whether the room's pages may be freed now. */
  protected abstract canFree(room: EngineRoom): boolean;
  abstract queueDepths(): Record<string, number>;

  protected tryRelease(room: EngineRoom): void {
    if (room.released || !this.canFree(room)) return;
    room.released = true;
    const pages = this.allocator.release(room.view.room);
    room.pages = null;
    void this.append(room, 'room.released', { pages, ...this.releaseData(room) });
    this.forgetIfDone(room);
  }

  /** Frees the room now, whatever runs (the control plane knows the peer is gone). */
  protected forceRelease(room: EngineRoom): void {
    room.stopped = true;
    room.transferDone = true;
    room.peerReleased = true;
    this.tryRelease(room);
  }

  protected fail(room: EngineRoom, reason: RoomFailureReason, stage: RoomState): void {
    this.log.warn({ room: room.view.room, reason, stage }, 'failing room');
    void this.append(room, 'room.failed', { reason, stage, detectedBy: `engine:${this.id}` });
    this.stop(room);
    this.forgetIfDone(room);
  }

  /** Appends an event for the room; resolves with the ack, or null when the bus refused it. */
  protected async append<T extends RoomEventType>(
    room: EngineRoom,
    type: T,
    data: EventData<T>,
  ): Promise<AppendAck | null> {
    try {
      const cause = room.cause ?? undefined;
      hop('engine-appends', type, room.view.room);
      return await this.ports.append(this.ids.uuid(), {
        type,
        room: room.view.room,
        data,
        ...(cause !== undefined ? { cause } : {}),
      });
    } catch (err) {
      this.log.error({ room: room.view.room, type, err }, 'append refused');
      return null;
    }
  }

  /**
   * The tokens of the room's context, as the model reads its request; null (the room failed
   * `request_unusable` in `stage`) when it cannot, e.g. a request without the token ids a
   * llama.cpp model needs.
   */
  protected contextTokens(room: EngineRoom, stage: RoomState): number[] | null {
    try {
      return room.request ? this.model.contextTokens(room.request) : null;
    } catch (err) {
      this.log.warn(
        { room: room.view.room, err: (err as Error).message },
        'request has no usable tokens',
      );
      this.fail(room, 'request_unusable', stage);
      return null;
    }
  }

  /** Pages for `tokens` positions of KV. */
  protected pagesFor(tokens: number): number {
    return pagesFor(this.model.kv, this.opts.pageBytes, tokens);
  }

  onCommand(cmd: ControlMessage<'command'>): void {
    const room = cmd.room === null ? undefined : this.rooms.get(cmd.room);
    this.log.info({ command: cmd.command, room: cmd.room, reason: cmd.reason }, 'command');
    switch (cmd.command) {
      case 'abort_room':
        if (room) this.stop(room);
        return;
      case 'free_room':
        if (room) this.forceRelease(room);
        return;
      case 'reset_transfer':
        this.resetTransfer();
        return;
      case 'reset_in_place':
        this.onResetInPlace?.(cmd.reason ?? 'reset_in_place command');
        return;
      case 'inject_fault':
        this.injectFault(cmd.reason ?? '', cmd.room);
        return;
      case 'drain':
        if (this.state === 'ready') this.drainedByCommand = true;
        this.state = 'draining';
        return;
      case 'undrain':
        // Only a drain an operator asked for: an engine draining to exit stays draining.
        if (this.state === 'draining' && this.drainedByCommand) {
          this.state = 'ready';
          this.drainedByCommand = false;
        } else this.log.warn({ state: this.state }, 'undrain ignored: not drained by a command');
        return;
      case 'shutdown':
        this.onShutdown?.();
        return;
    }
  }

  /** Drill fault `compute_hang`: the work loop waits, doing nothing, until it is cleared. */
  protected computeHung = false;

  /** Resolves once the compute may go on (at once, unless a drill hung it). */
  protected async computeAllowed(): Promise<void> {
    while (this.computeHung) await new Promise<void>((r) => this.clock.setTimeout(r, 20));
  }

  /** Set by the composition root: what a `shutdown` command does. */
  onShutdown: (() => void) | null = null;

  /** Set by the composition root: the in-place reset (bus connection and transfer endpoint). */
  onResetInPlace: ((reason: string) => void) | null = null;

  /**
   * Cancels transfers in flight for longer than `olderThanMs` (their rooms fail as
   * `transfer_cancelled`) and clears injected faults. Prefill only; nothing to do on decode.
   */
  resetTransfer(_olderThanMs = 0): number {
    return 0;
  }

  /**
   * Drill fault injection — into the transfer core (`kind[:ms]`, for one room or all), or
   * `compute_hang` into the model's compute; `none` clears both — refused unless the engine was
   * started with `--allow-fault-injection`.
   */
  private injectFault(spec: string, room: string | null): void {
    if (!this.opts.allowFaultInjection) {
      this.log.warn(
        { spec, room },
        'inject_fault refused: start the engine with --allow-fault-injection',
      );
      return;
    }
    if (spec === COMPUTE_HANG || spec === 'none') {
      // The model's compute never returns (a GPU kernel that hangs) while the process, its bus
      // and its heartbeats live on. Only a new process clears it (or `none`): not the in-place
      // reset, which is the point of the drill.
      this.computeHung = spec === COMPUTE_HANG;
      if (this.computeHung) {
        this.log.warn({ spec }, 'drill: compute hung');
        return;
      }
    }
    try {
      const fault = parseFault(spec, 'inject_fault');
      if (fault === null) this.clearFaults();
      else this.applyFault(room === null ? fault : { ...fault, room });
      this.log.warn({ spec, room }, 'drill: transfer fault injected');
    } catch (err) {
      this.log.warn({ spec, err: (err as Error).message }, 'inject_fault refused');
    }
  }

  protected applyFault(fault: Fault): void {
    this.log.warn({ fault }, 'this engine has no transfer core; fault ignored');
  }

  protected clearFaults(): void {}

  /** Draining because an operator sent `drain` (an `undrain` takes it back), not to exit. */
  private drainedByCommand = false;

  /** Stops taking rooms and resolves once every room is released (or after `timeoutMs`). */
  drain(timeoutMs: number): Promise<boolean> {
    this.state = 'draining';
    this.drainedByCommand = false;
    const idle = this.idle.wait(timeoutMs);
    this.notifyIdle();
    return idle;
  }

  private notifyIdle(): void {
    if (this.heldRooms().length === 0) this.idle.fire();
  }
}
