/**
 * The control plane's side of each engine's connection: accepting a hello (the checks of
 * hello.ts) and replaying what the engine missed, delivering committed events to it in seq order
 * with their `prevSeq` (docs/protocol.md, "Ordering, replay and retries"), commands, and fencing
 * an incarnation declared lost. What engines send back is appends.ts's and tokens.ts's.
 */

import type { Admission } from '../../bus/admission.ts';
import {
  type CommandName,
  type EngineMessage,
  HEARTBEAT_MS,
  PROTOCOL_VERSION,
} from '../../bus/protocol.ts';
import { type PeerQuotaOptions, type QuotaKind, TokenBucket } from '../../bus/quotas.ts';
import type { BusServer, PeerId } from '../../bus/server.ts';
import type { JournalLog } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import type { Clock } from '../../ports/clock.ts';
import type { JournalEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import { BoundedMap } from '../bounded-map.ts';
import type { ControlCounters } from '../bus.ts';
import type { LastRegistration } from '../checkpoint/state.ts';
import type { RoomBook } from '../rooms/room-book.ts';
import { actsOn } from './acts-on.ts';
import type { EngineSession } from './engine-session.ts';
import {
  checkHello,
  type HelloRefusal,
  openSession,
  REGISTRATION_EVERY_MS,
  REGISTRATIONS_BURST,
} from './hello.ts';
import { kvPeerFor } from './kv-peer.ts';
import type { EngineRegistry } from './registry.ts';
import { type Backlog, backlogFor } from './rejoin.ts';
import { ThrottleRecord } from './throttles.ts';

export interface EngineLinkDeps {
  journal: JournalLog;
  /** The bus, bound by the control plane once everything is built. */
  bus: BusServer;
  /** Who may say hello as which engine. */
  admission: Admission;
  registry: EngineRegistry;
  /** The model the engines must run (`ModelInfo.format`); null: any. */
  modelFormat: string | null;
  /** Tokens per prefix block (`--kv-block-tokens`): an engine announcing another is told off in the log. */
  blockTokens: number;
  counters: ControlCounters;
  log: Logger;
  /** The rooms: the request sent to a prefill engine with its `room.created`, and who holds rooms. */
  rooms: Pick<RoomBook, 'request' | 'liveOn'>;
  /** An engine came back as a new incarnation: the old one's rooms are lost (migrate them). */
  replaced(engine: string, oldIncarnation: string): Promise<void>;
  clock: Clock;
}

/** How many fenced incarnations and connections are remembered (the oldest are forgotten). */
const FENCES_KEPT = 256;

export class EngineLink {
  private readonly bus: BusServer;
  private readonly registrations = new Map<string, TokenBucket>();
  /** Incarnations declared lost while their process may live (`fence`), and why: never again. */
  private readonly fencedIncarnations = new BoundedMap<string, string>(FENCES_KEPT);
  /** Their bus connections, why, and when last told: what they send is answered BUS_FENCED. */
  private readonly fencedPeers = new BoundedMap<PeerId, { reason: string; toldAt: number }>(
    FENCES_KEPT,
  );
  private readonly throttles: ThrottleRecord;
  /** Sessions handed out so far (one per accepted hello). */
  private sessions = 0;
  /**
   * Each engine's last registration by a control plane before this one (restored at start:
   * checkpoint/state.ts), for a hello this control plane has not welcomed yet:
   *
   * - Of another incarnation, when this control plane has no session of the engine: that process
   *   died unseen — while no control plane ran, or before this one started — and its rooms
   *   (moved, ended, or awaiting its release, which a surviving peer waits on before freeing its
   *   pages) are this control plane's to settle (found by the simulator, `--faults all` seed 41).
   * - Of this incarnation: the same process, reconnecting from the control plane before. It must
   *   get everything of its rooms since then, ended ones too, even if it applied no event yet
   *   (seed 5101: rooms created and failed while it was cut off never reached it).
   */
  registeredAtStart: ReadonlyMap<string, LastRegistration> = new Map();

  constructor(private readonly deps: EngineLinkDeps) {
    this.bus = deps.bus;
    this.throttles = new ThrottleRecord(deps.journal, deps.log, deps.clock);
  }

  /** A peer ran over a bus quota (quotas.ts): journaled once per engine per minute. */
  throttled(engine: string | null, kind: QuotaKind, q: PeerQuotaOptions): void {
    this.throttles.note(
      engine,
      kind === 'hellos'
        ? `more than ${q.hellosBurst} hellos at once, or ${q.hellosPerSecond}/s, on one connection`
        : `more than ${q.messagesBurst} bus messages at once, or ${q.messagesPerSecond}/s, on one connection`,
      `its ${kind} over the quota are dropped unread until it keeps within it`,
    );
  }

  /** Whether `engine` may register one more new incarnation now. */
  private mayRegister(engine: string, now: number): boolean {
    let b = this.registrations.get(engine);
    if (!b) {
      b = new TokenBucket(1000 / REGISTRATION_EVERY_MS, REGISTRATIONS_BURST, now);
      this.registrations.set(engine, b);
    }
    return b.take(now);
  }

  /**
   * The engine's process is gone (its supervisor saw it exit): this session gets no new room and
   * no event, though it stays registered until the engine says hello again or expires.
   */
  gone(engine: string, incarnation: string): void {
    const s = this.deps.registry.get(engine);
    if (s && s.incarnation === incarnation) s.delivery.live = false;
  }

  /**
   * Sends a command to a connected engine (see control-plane.ts `command`); false when it is
   * not connected.
   */
  command(
    engine: string,
    command: CommandName,
    room: string | null,
    reason: string | null,
  ): boolean {
    const s = this.deps.registry.get(engine);
    if (!s?.delivery.live) return false;
    this.deps.log.info({ engine, command, room, reason }, 'command sent');
    this.bus.send(s.peer, 'command', { command, room, reason });
    return true;
  }

  /**
   * Declares the engine's incarnation lost though its process may live (control-plane.ts
   * `fence`): no new room or event for it, its connection is dropped, and anything it sends from
   * now on — appends, tokens, heartbeats, a hello of that incarnation — is answered BUS_FENCED,
   * so it exits and comes back as a new incarnation.
   */
  fence(engine: string, incarnation: string, reason: string): boolean {
    const s = this.deps.registry.get(engine);
    if (!s || s.incarnation !== incarnation) return false;
    const why = `engine ${engine} incarnation ${incarnation} was declared lost (${reason}) and its rooms moved; nothing it holds is applied: exit and start again`;
    s.delivery.live = false;
    this.bus.unregister(s.peer);
    this.fencedIncarnations.set(`${engine}/${incarnation}`, why);
    this.fencedPeers.set(s.peer, { reason: why, toldAt: 0 });
    return true;
  }

  /** Drops an engine from the registry and the bus (it must say hello again to come back). */
  forget(engine: string): void {
    const s = this.deps.registry.get(engine);
    if (!s) return;
    this.deps.registry.delete(engine);
    this.bus.unregister(s.peer);
  }

  /** Forgets engines silent for `ms` that hold no live room; returns them. */
  expire(ms: number, now: number): string[] {
    const silent = this.deps.registry.silent(ms, now);
    const gone = silent.filter((s) => this.deps.rooms.liveOn(s.engine) === 0).map((s) => s.engine);
    for (const engine of gone) this.forget(engine);
    if (gone.length > 0)
      this.deps.log.info({ engines: gone }, 'forgot engines long silent with no rooms');
    return gone;
  }

  /**
   * Whether this bus connection may not be registered again (its incarnation was fenced): why,
   * and whether to tell it now — at most once a second, however many frames it sends.
   */
  fencedPeer(peer: PeerId, now = this.deps.clock.now()): { reason: string; tell: boolean } | null {
    const f = this.fencedPeers.get(peer);
    if (!f) return null;
    const tell = now - f.toldAt >= 1000;
    if (tell) f.toldAt = now;
    return { reason: f.reason, tell };
  }

  /**
   * An engine says hello: the checks of hello.ts, then its session is registered, an earlier
   * incarnation's rooms are migrated, and what it missed is replayed before live events flow.
   */
  async hello(peer: PeerId, msg: EngineMessage<'hello'>): Promise<void> {
    this.deps.counters.hellos++;
    const prev = this.deps.registry.get(msg.engine);
    const verdict = checkHello(msg, {
      admission: this.deps.admission,
      prev,
      modelFormat: this.deps.modelFormat,
      fenced: (engine, incarnation) => this.fencedIncarnations.get(`${engine}/${incarnation}`),
      mayRegister: (engine) => this.mayRegister(engine, this.deps.clock.now()),
      now: this.deps.clock.now(),
      others: (engine) => this.deps.registry.all().filter((s) => s.engine !== engine),
    });
    if (!verdict.ok) {
      this.refuseHello(peer, msg, verdict.refusal);
      return;
    }
    const session = this.register(peer, msg, verdict.key, prev, verdict.fresh);
    // Before the replay is read: the new process must see the old one's rooms as migrated.
    if (prev && verdict.fresh) await this.deps.replaced(msg.engine, prev.incarnation);
    else if (session.delivery.joinedSeq === null) {
      const before = this.registeredAtStart.get(msg.engine);
      if (before?.incarnation === msg.incarnation) session.delivery.joinedSeq ??= before.seq;
      else if (before && !prev) await this.deps.replaced(msg.engine, before.incarnation);
    }
    const backlog = await backlogFor(this.deps, session, msg);
    // A newer hello from the same engine took over while we read.
    if (!backlog || this.deps.registry.get(msg.engine) !== session) return;
    if (this.journalBehind(peer, msg, backlog.headSeq)) return;
    this.welcome(peer, session, msg, backlog);
  }

  private refuseHello(peer: PeerId, msg: EngineMessage<'hello'>, r: HelloRefusal): void {
    if (r.drop === 'unauthorized')
      this.bus.drops.record('unauthorized', { engine: msg.engine, reason: r.message });
    if (r.drop === 'rate_limited')
      this.bus.drops.record('rate_limited', { engine: msg.engine, kind: 'hello' });
    if (r.log) this.deps.log[r.log.level](r.log.fields, r.log.msg);
    if (r.throttle) this.throttles.note(msg.engine, r.throttle.what, r.throttle.effect);
    this.bus.send(peer, 'nack', {
      eventId: null,
      code: r.code,
      message: r.message,
      retryable: r.retryable,
    });
  }

  /** Opens the admitted hello's session; a new incarnation is journaled `engine.registered`. */
  private register(
    peer: PeerId,
    msg: EngineMessage<'hello'>,
    key: string,
    prev: EngineSession | undefined,
    fresh: boolean,
  ): EngineSession {
    const { log } = this.deps;
    const session = openSession(
      msg,
      peer,
      key,
      prev,
      fresh,
      ++this.sessions,
      this.deps.clock.now(),
    );
    this.deps.registry.set(session);
    this.bus.register(peer, msg.engine);
    if (!fresh) {
      log.info({ engine: msg.engine, lastSeq: msg.lastSeq }, 'engine reconnected');
      return session;
    }
    log.info(
      { engine: msg.engine, role: msg.role, incarnation: msg.incarnation, pid: msg.pid },
      'engine registered',
    );
    if (msg.prefix && msg.prefix.blockTokens !== this.deps.blockTokens)
      log.warn(
        {
          engine: msg.engine,
          engineBlockTokens: msg.prefix.blockTokens,
          blockTokens: this.deps.blockTokens,
        },
        `its prefix blocks are ${msg.prefix.blockTokens} tokens and this control plane's ${this.deps.blockTokens}: the blocks it reports are refused (pdctl_prefix_blocks_refused_total) and it gets no cache hits; start both with the same --kv-block-tokens`,
      );
    this.deps.journal
      .append({
        type: 'engine.registered',
        engine: msg.engine,
        source: 'control',
        data: {
          role: msg.role,
          incarnation: msg.incarnation,
          pid: msg.pid,
          pool: msg.pool,
          pages: msg.pages,
          ...(msg.prefix ? { prefix: msg.prefix } : {}),
          // Which model, and what llama.cpp gave it: after an incident, which engine ran on the CPU.
          ...(msg.model ? { model: msg.model } : {}),
          ...(msg.runtime ? { runtime: msg.runtime } : {}),
        },
      })
      .catch((err) =>
        log.error({ err, engine: msg.engine }, 'could not journal engine.registered'),
      );
    return session;
  }

  /**
   * The engine applied events past the end of the journal (restored or replaced?): reconciliation
   * cannot diff against a journal that ends before the engine's history, so it is told to rejoin fresh.
   */
  private journalBehind(peer: PeerId, msg: EngineMessage<'hello'>, headSeq: number): boolean {
    if (msg.lastSeq <= headSeq) return false;
    this.deps.log.error(
      { engine: msg.engine, engineSeq: msg.lastSeq, journalSeq: headSeq },
      'engine has applied events past the end of the journal (restored or replaced?); told to rejoin fresh',
    );
    this.bus.send(peer, 'nack', {
      eventId: null,
      code: 'BUS_JOURNAL_BEHIND',
      message: `this engine applied up to seq ${msg.lastSeq}, but the journal ends at seq ${headSeq}: it was restored or replaced; restart the engine so that it rejoins fresh`,
      retryable: false,
    });
    this.deps.journal
      .append({
        type: 'recovery.action',
        engine: msg.engine,
        source: 'control',
        data: {
          action: 'reconcile',
          reason: `engine at seq ${msg.lastSeq}, journal ends at ${headSeq}`,
          outcome: 'engine told to rejoin as a fresh process',
        },
      })
      .catch(() => {});
    return true;
  }

  /** Welcomes the engine, replays its backlog and what arrived meanwhile, then goes live. */
  private welcome(
    peer: PeerId,
    session: EngineSession,
    msg: EngineMessage<'hello'>,
    backlog: Backlog,
  ): void {
    this.bus.send(peer, 'welcome', {
      protocol: PROTOCOL_VERSION,
      engine: msg.engine,
      incarnation: msg.incarnation,
      session: session.delivery.session,
      replayFrom: msg.lastSeq,
      replayEvents: backlog.events.length,
      heartbeatMs: HEARTBEAT_MS,
    });
    for (const ev of backlog.events) this.sendEvent(session, ev);
    session.delivery.sentSeq = backlog.headSeq;
    session.delivery.joinedSeq ??= backlog.headSeq;
    for (const ev of session.delivery.buffer) {
      if (ev.seq > session.delivery.sentSeq) {
        this.sendEvent(session, ev);
        session.delivery.sentSeq = ev.seq;
      }
    }
    session.delivery.buffer = [];
    session.delivery.live = true;
    if (backlog.events.length > 0) {
      this.deps.log.info(
        { engine: msg.engine, events: backlog.events.length, from: msg.lastSeq },
        'replayed the engine’s rooms',
      );
    }
  }

  private sendEvent(session: EngineSession, ev: JournalEvent, lazy = false): void {
    const request =
      ev.type === 'room.created' && ev.room ? this.deps.rooms.request(ev.room) : undefined;
    const payload = {
      event: ev,
      prevSeq: session.delivery.lastDelivered,
      ...(request ? { request } : {}),
      ...(session.role === 'prefill' ? kvPeerFor(ev, this.deps.registry) : {}),
    };
    session.delivery.lastDelivered = ev.seq;
    this.bus.send(session.peer, 'event', payload, lazy);
    this.deps.counters.delivered++;
  }

  deliver(room: Room, ev: JournalEvent): void {
    for (const engine of new Set([room.prefillEngine, room.decodeEngine])) {
      const s = this.deps.registry.get(engine);
      if (!s) continue;
      if (!s.delivery.live) {
        s.delivery.buffer.push(ev);
      } else if (ev.seq > s.delivery.sentSeq) {
        s.delivery.sentSeq = ev.seq;
        this.sendEvent(s, ev, !actsOn(engine, room, ev));
      }
    }
  }
}
