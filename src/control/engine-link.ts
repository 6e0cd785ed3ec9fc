/**
 * The control plane's side of each engine's connection: accepting a hello and replaying what the
 * engine missed, taking its appends in order and relaying them to the journal, and delivering
 * committed events to it in seq order with their `prevSeq` (docs/protocol.md, "Ordering, replay
 * and retries").
 */

import type { Admission } from '../bus/admission.ts';
import {
  type EngineMessage,
  HEARTBEAT_MS,
  type KvRemote,
  PROTOCOL_VERSION,
  type RoomRequest,
} from '../bus/protocol.ts';
import { type PeerQuotaOptions, type QuotaKind, TokenBucket } from '../bus/quotas.ts';
import type { BusServer, PeerId } from '../bus/server.ts';
import { JournalError } from '../journal/errors.ts';
import type { JournalEvent } from '../journal/events.ts';
import type { Room } from '../journal/reducer.ts';
import type { JournalStore } from '../journal/store.ts';
import type { Logger } from '../log.ts';
import type { EngineRegistry, EngineSession } from './registry.ts';
import { ThrottleRecord } from './throttles.ts';

export interface ControlCounters {
  appends: number;
  nacks: number;
  tokens: number;
  tokensDropped: number;
  delivered: number;
  hellos: number;
}

export interface EngineLinkDeps {
  journal: JournalStore;
  /** Who may say hello as which engine. */
  admission: Admission;
  registry: EngineRegistry;
  /** The model the engines must run (`ModelInfo.format`); null: any. */
  modelFormat: string | null;
  counters: ControlCounters;
  log: Logger;
  /**
   * The engines of a room, while the control plane still knows it (live, or ended recently): an
   * engine appends only for rooms it holds.
   */
  roomOwners(room: string): { prefillEngine: string; decodeEngine: string } | undefined;
  /** The request behind a room, attached to its `room.created` for the prefill engine. */
  request(room: string): RoomRequest | undefined;
  /**
   * Whether the journal would refuse this event from this engine now, as far as the view knows —
   * the committed view plus the engine's appends still on their way to a commit (an engine sends
   * `prefill_started` and `transfer_posted` back to back). False also records the event as on
   * its way, until `settled`.
   */
  wouldReject(event: EngineMessage<'append'>['event'], engine: string): boolean;
  /** An append that `wouldReject` let through has committed or failed. */
  settled(room: string): void;
  /** Measures an append's latency. */
  timed<T>(p: Promise<T>): Promise<T>;
  /** An engine came back as a new incarnation: the old one's rooms are lost (migrate them). */
  replaced(engine: string, oldIncarnation: string): Promise<void>;
}

/** The room events each role sends (docs/protocol.md); anything else from it is refused. */
export const ENGINE_APPENDS = {
  prefill: [
    'room.prefill_started',
    'room.transfer_posted',
    'room.transfer_completed',
    'room.failed',
    'room.released',
  ],
  decode: [
    'room.bootstrap_started',
    'room.bootstrapped',
    'room.decode_started',
    'room.completed',
    'room.failed',
    'room.released',
  ],
} as const;

/**
 * An engine's event ids live in a namespace of their own, `engine:<id>/<its id>`, which no id the
 * control plane makes can enter (those start with a room id or are UUIDs): a peer can never occupy
 * the id of an abort or failure the control plane will append later.
 */
export function engineEventId(engine: string, eventId: string): string {
  return `engine:${engine}/${eventId}`;
}

/** Refused events an engine may have journaled per second (and in one burst) before they are only counted. */
export const REJECTIONS_PER_SECOND = 50;
const REJECTION_BURST = 500;

/** A token bucket per engine for appends the journal would record as `room.event_rejected`. */
class RejectionBudget {
  private readonly buckets = new Map<string, { tokens: number; at: number }>();

  /** False when `engine` has no budget left for another rejection. Appends that fit always pass. */
  take(engine: string, rejection: boolean, now = Date.now()): boolean {
    if (!rejection) return true;
    const b = this.buckets.get(engine) ?? { tokens: REJECTION_BURST, at: now };
    b.tokens = Math.min(REJECTION_BURST, b.tokens + ((now - b.at) / 1000) * REJECTIONS_PER_SECOND);
    b.at = now;
    this.buckets.set(engine, b);
    if (b.tokens < 1) return false;
    b.tokens -= 1;
    return true;
  }
}

/**
 * New incarnations one engine id may register: a burst, then one per this many ms. A real engine
 * is restarted a few times an hour at worst (the ladder caps restarts at 3 in 10 minutes); a
 * holder of its key that says hello as a new process over and over would otherwise add an
 * `engine.registered` and a replay of the engine's history each time.
 */
export const REGISTRATIONS_BURST = 5;
export const REGISTRATION_EVERY_MS = 10_000;

export class EngineLink {
  /** Set once the bus is bound. */
  bus!: BusServer;
  private readonly rejections = new RejectionBudget();
  private readonly registrations = new Map<string, TokenBucket>();
  /** Incarnations declared lost while their process may live (`fence`), and why: never again. */
  private readonly fencedIncarnations = new Map<string, string>();
  /** Their bus connections, why, and when last told: what they send is answered BUS_FENCED. */
  private readonly fencedPeers = new Map<PeerId, { reason: string; toldAt: number }>();
  private readonly throttles: ThrottleRecord;
  /** Sessions handed out so far (one per accepted hello). */
  private sessions = 0;

  constructor(private readonly deps: EngineLinkDeps) {
    this.throttles = new ThrottleRecord(deps.journal, deps.log);
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
    remember(this.fencedIncarnations, `${engine}/${incarnation}`, why);
    remember(this.fencedPeers, s.peer, { reason: why, toldAt: 0 });
    return true;
  }

  /**
   * Whether this bus connection may not be registered again (its incarnation was fenced): why,
   * and whether to tell it now — at most once a second, however many frames it sends.
   */
  fencedPeer(peer: PeerId, now = Date.now()): { reason: string; tell: boolean } | null {
    const f = this.fencedPeers.get(peer);
    if (!f) return null;
    const tell = now - f.toldAt >= 1000;
    if (tell) f.toldAt = now;
    return { reason: f.reason, tell };
  }

  async hello(peer: PeerId, msg: EngineMessage<'hello'>): Promise<void> {
    this.deps.counters.hellos++;
    const log = this.deps.log;
    if (msg.protocol !== PROTOCOL_VERSION) {
      this.bus.send(peer, 'nack', {
        eventId: null,
        code: 'BUS_PROTOCOL_MISMATCH',
        message: `this control plane speaks protocol ${PROTOCOL_VERSION}, the engine ${msg.protocol}`,
        retryable: false,
      });
      return;
    }
    const prev = this.deps.registry.get(msg.engine);
    const verdict = this.deps.admission.verify(msg, msg.auth, prev?.key ?? null);
    if (!verdict.ok) {
      this.bus.drops.record('unauthorized', { engine: msg.engine, reason: verdict.reason });
      this.bus.send(peer, 'nack', {
        eventId: null,
        code: 'BUS_UNAUTHORIZED',
        message: verdict.reason,
        retryable: false,
      });
      return;
    }
    // Told only to a sender that proved it holds the engine's key.
    const fenced = this.fencedIncarnations.get(`${msg.engine}/${msg.incarnation}`);
    if (fenced !== undefined) {
      this.bus.send(peer, 'nack', {
        eventId: null,
        code: 'BUS_FENCED',
        message: fenced,
        retryable: false,
      });
      return;
    }
    if (prev && prev.role !== msg.role) {
      log.error(
        { engine: msg.engine, was: prev.role, now: msg.role },
        'engine id reused with another role; refused',
      );
      this.bus.send(peer, 'nack', {
        eventId: null,
        code: 'BUS_INVALID_EVENT',
        message: `engine ${msg.engine} is registered as ${prev.role}; pick another --id`,
        retryable: false,
      });
      return;
    }
    // Both ways: a control plane of the built-in model cannot drive llama.cpp engines either
    // (they take token ids it does not send).
    const format = this.deps.modelFormat;
    if ((msg.model ?? null) !== format) {
      log.warn(
        { engine: msg.engine, model: msg.model, serving: format },
        'engine of another model refused',
      );
      this.bus.send(peer, 'nack', {
        eventId: null,
        code: 'BUS_MODEL_MISMATCH',
        message: `this control plane serves ${format ?? 'the built-in model'}; the engine runs ${msg.model ?? 'the built-in model'}: start both with the same --model and --sequences`,
        retryable: false,
      });
      return;
    }
    const fresh = !prev || prev.incarnation !== msg.incarnation;
    const now = Date.now();
    if (fresh && !this.mayRegister(msg.engine, now)) {
      this.bus.drops.record('rate_limited', { engine: msg.engine, kind: 'hello' });
      this.throttles.note(
        msg.engine,
        `more than ${REGISTRATIONS_BURST} new incarnations at once, or one per ${REGISTRATION_EVERY_MS / 1000} s`,
        'hellos of new incarnations over the quota are refused (BUS_RATE_LIMITED); the registered one keeps serving',
      );
      this.bus.send(peer, 'nack', {
        eventId: null,
        code: 'BUS_RATE_LIMITED',
        message: `engine ${msg.engine} registered more than ${REGISTRATIONS_BURST} new incarnations in a short time; this hello is refused, try again in ${REGISTRATION_EVERY_MS / 1000} s`,
        retryable: true,
      });
      return;
    }
    const session: EngineSession = {
      engine: msg.engine,
      role: msg.role,
      incarnation: msg.incarnation,
      key: verdict.key,
      pid: msg.pid,
      peer,
      pool: msg.pool,
      epoch: msg.epoch,
      pages: msg.pages,
      pageBytes: msg.pageBytes,
      kv: msg.kv ?? null,
      model: msg.model ?? null,
      faultInjection: msg.faultInjection === true,
      kvDevice: msg.kvDevice ?? null,
      host: msg.host ?? null,
      kvRemote: msg.kvRemote ?? null,
      kvSend: msg.kvSend ?? 'auto',
      connectedAt: now,
      delivery: {
        live: false,
        session: ++this.sessions,
        nextN: 1,
        broken: false,
        sentSeq: 0,
        lastDelivered: msg.lastSeq,
        buffer: [],
      },
      health: {
        lastSeen: now,
        // The same process keeps its counters: its next heartbeat is compared with its last one.
        heartbeat: fresh ? null : (prev?.health.heartbeat ?? null),
        beats: 0,
        owedSeq: 0,
        behindSince: 0,
        transferMovedAt: now,
        // The same process (an in-place reset) keeps its loops' history: one that was frozen before
        // the new connection is still frozen until its tick moves.
        workMovedAt: fresh ? now : (prev?.health.workMovedAt ?? now),
        progressAt: fresh ? now : (prev?.health.progressAt ?? now),
        canaryFailures: 0,
        canaryFailingSince: 0,
        canaryReason: '',
      },
      load: {
        liveRooms: prev?.load.liveRooms ?? 0,
        // The same process keeps what was promised to its rooms; a new one starts empty.
        reservedPages: fresh ? 0 : (prev?.load.reservedPages ?? 0),
      },
    };
    this.deps.registry.set(session);
    this.bus.register(peer, msg.engine);
    if (fresh) {
      log.info(
        { engine: msg.engine, role: msg.role, incarnation: msg.incarnation, pid: msg.pid },
        'engine registered',
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
          },
        })
        .catch((err) =>
          log.error({ err, engine: msg.engine }, 'could not journal engine.registered'),
        );
    } else {
      log.info({ engine: msg.engine, lastSeq: msg.lastSeq }, 'engine reconnected');
    }
    // Before the replay is read: the new process must see the old one's rooms as migrated.
    if (prev && fresh) await this.deps.replaced(msg.engine, prev.incarnation);
    let backlog: Awaited<ReturnType<JournalStore['engineBacklog']>>;
    try {
      backlog = await this.deps.journal.engineBacklog(msg.engine, msg.lastSeq);
    } catch (err) {
      log.error(
        { err, engine: msg.engine },
        'cannot read the engine’s backlog; it will say hello again',
      );
      session.delivery.buffer = [];
      return;
    }
    // A newer hello from the same engine took over while we read.
    if (this.deps.registry.get(msg.engine) !== session) return;
    if (msg.lastSeq > backlog.headSeq) {
      // Reconciliation cannot diff against a journal that ends before the engine's history.
      log.error(
        { engine: msg.engine, engineSeq: msg.lastSeq, journalSeq: backlog.headSeq },
        'engine has applied events past the end of the journal (restored or replaced?); told to rejoin fresh',
      );
      this.bus.send(peer, 'nack', {
        eventId: null,
        code: 'BUS_JOURNAL_BEHIND',
        message: `this engine applied up to seq ${msg.lastSeq}, but the journal ends at seq ${backlog.headSeq}: it was restored or replaced; restart the engine so that it rejoins fresh`,
        retryable: false,
      });
      this.deps.journal
        .append({
          type: 'recovery.action',
          engine: msg.engine,
          source: 'control',
          data: {
            action: 'reconcile',
            reason: `engine at seq ${msg.lastSeq}, journal ends at ${backlog.headSeq}`,
            outcome: 'engine told to rejoin as a fresh process',
          },
        })
        .catch(() => {});
      return;
    }
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
    for (const ev of session.delivery.buffer) {
      if (ev.seq > session.delivery.sentSeq) {
        this.sendEvent(session, ev);
        session.delivery.sentSeq = ev.seq;
      }
    }
    session.delivery.buffer = [];
    session.delivery.live = true;
    if (backlog.events.length > 0) {
      log.info(
        { engine: msg.engine, events: backlog.events.length, from: msg.lastSeq },
        'replayed the engine’s rooms',
      );
    }
  }

  /**
   * Appends of one session must arrive as n = 1, 2, 3, … An append of an older session (it sat in
   * a dead connection's queue) is dropped; a gap means one was lost, and taking the next would
   * reorder the engine's events (transfer_posted before prefill_started): drop the rest and make
   * the engine open a new session, which resends everything unacknowledged in order.
   */
  private inSequence(peer: PeerId, engine: string, msg: EngineMessage<'append'>): boolean {
    const s = this.deps.registry.get(engine);
    if (!s || msg.session !== s.delivery.session) {
      this.bus.drops.record('stale_session', {
        engine,
        session: msg.session,
        eventId: msg.eventId,
      });
      return false;
    }
    if (msg.n < s.delivery.nextN) return true; // a resend within the session: the journal dedupes it
    if (msg.n > s.delivery.nextN || s.delivery.broken) {
      this.bus.drops.record('out_of_order', { engine, expected: s.delivery.nextN, got: msg.n });
      if (!s.delivery.broken) {
        s.delivery.broken = true;
        this.bus.send(peer, 'nack', {
          eventId: null,
          code: 'BUS_NOT_REGISTERED',
          message: `append ${s.delivery.nextN} of session ${s.delivery.session} never arrived; say hello again`,
          retryable: true,
        });
      }
      return false;
    }
    s.delivery.nextN++;
    return true;
  }

  append(peer: PeerId, engine: string, msg: EngineMessage<'append'>): void {
    if (!this.inSequence(peer, engine, msg)) return;
    const s = this.deps.registry.get(engine);
    if (!s) return;
    const { type, room, data } = msg.event;
    const refuse = (message: string) => {
      this.deps.counters.nacks++;
      this.bus.send(peer, 'nack', {
        eventId: msg.eventId,
        code: 'BUS_INVALID_EVENT',
        message,
        retryable: false,
      });
    };
    if (!(ENGINE_APPENDS[s.role] as readonly string[]).includes(type)) {
      this.bus.drops.record('not_owner', { engine, type, room });
      refuse(`a ${s.role} engine may not append ${type}`);
      return;
    }
    const owners = this.deps.roomOwners(room);
    const mine =
      owners !== undefined &&
      (s.role === 'prefill' ? owners.prefillEngine : owners.decodeEngine) === engine;
    if (!mine) {
      // Nothing is journaled for a room the engine never held: a peer cannot grow the journal
      // with events about rooms that are not its own.
      this.bus.drops.record('not_owner', { engine, type, room });
      refuse(
        owners
          ? `room ${room} belongs to ${owners.prefillEngine} (prefill) and ${owners.decodeEngine} (decode), not to ${s.role} engine ${engine}`
          : `room ${room} is not a room this control plane gave to ${engine}`,
      );
      return;
    }
    const rejected = this.deps.wouldReject(msg.event, engine);
    if (!this.rejections.take(engine, rejected)) {
      this.bus.drops.record('rate_limited', { engine, type, room });
      refuse(
        `${engine} sent more out-of-order events than the journal records (${REJECTIONS_PER_SECOND}/s); this one was not recorded`,
      );
      return;
    }
    this.deps.counters.appends++;
    this.deps
      .timed(
        this.deps.journal.append({
          type,
          room,
          engine,
          source: `engine:${engine}`,
          eventId: engineEventId(engine, msg.eventId),
          data,
        } as Parameters<JournalStore['append']>[0]),
      )
      .finally(() => {
        if (!rejected) this.deps.settled(room);
      })
      .then(
        (res) => {
          const to = this.deps.registry.get(engine)?.peer ?? peer;
          this.bus.send(to, 'ack', {
            eventId: msg.eventId,
            status: res.status,
            original: res.status === 'duplicate' ? res.original : null,
            seq: res.seq,
            reason: res.status === 'rejected' ? res.reason : null,
            detail: res.status === 'rejected' ? res.detail.slice(0, 1000) : null,
          });
        },
        (err) => {
          const e = JournalError.from(err);
          const retryable = e.code !== 'JOURNAL_INVALID_EVENT';
          this.deps.counters.nacks++;
          this.bus.send(this.deps.registry.get(engine)?.peer ?? peer, 'nack', {
            eventId: msg.eventId,
            code: retryable ? 'BUS_JOURNAL_UNAVAILABLE' : 'BUS_INVALID_EVENT',
            message: e.message.slice(0, 2000),
            retryable,
          });
        },
      );
  }

  private sendEvent(session: EngineSession, ev: JournalEvent): void {
    const request = ev.type === 'room.created' && ev.room ? this.deps.request(ev.room) : undefined;
    const payload = {
      event: ev,
      prevSeq: session.delivery.lastDelivered,
      ...(request ? { request } : {}),
      ...(ev.type === 'room.bootstrapped' && session.role === 'prefill'
        ? { kvPeer: this.kvPeer(ev.engine) }
        : {}),
    };
    session.delivery.lastDelivered = ev.seq;
    this.bus.send(session.peer, 'event', payload);
    this.deps.counters.delivered++;
  }

  /**
   * Where a room's decode engine runs, and how a prefill engine on another host reaches its pool:
   * what the prefill engine needs with `room.bootstrapped` to pick the transport (docs/protocol.md,
   * "Across hosts"). Without a host (an engine that did not say), it is taken for the prefill's.
   */
  private kvPeer(decodeEngine: string | null): { host?: string; ucx?: KvRemote } {
    const d = decodeEngine === null ? undefined : this.deps.registry.get(decodeEngine);
    return {
      ...(d?.host ? { host: d.host } : {}),
      ...(d?.kvRemote ? { ucx: d.kvRemote } : {}),
    };
  }

  deliver(room: Room, ev: JournalEvent): void {
    for (const engine of new Set([room.prefillEngine, room.decodeEngine])) {
      const s = this.deps.registry.get(engine);
      if (!s) continue;
      if (!s.delivery.live) {
        s.delivery.buffer.push(ev);
      } else if (ev.seq > s.delivery.sentSeq) {
        s.delivery.sentSeq = ev.seq;
        this.sendEvent(s, ev);
      }
    }
  }
}

/** How many fenced incarnations and connections are remembered (the oldest are forgotten). */
const FENCES_KEPT = 256;

function remember<K, V>(m: Map<K, V>, key: K, why: V): void {
  m.set(key, why);
  if (m.size > FENCES_KEPT) {
    const oldest = m.keys().next().value;
    if (oldest !== undefined) m.delete(oldest);
  }
}
