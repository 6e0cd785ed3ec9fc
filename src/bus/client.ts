/**
 * The engine's end of the bus: a DEALER connected to the control plane's ROUTER. It says hello on
 * every (re)connection, resends appends that were never acknowledged once welcomed (the control
 * plane stores a retried event once, by its event id), and hands committed events and commands to
 * the engine. Like the server, its receive loop is supervised and never dies on a bad frame.
 */
import type { Logger } from '../log.ts';
import { type Clock, systemClock, type Timer } from '../ports/clock.ts';
import { connectionRoutingId } from './admission.ts';
import type { CurveClientKeys } from './curve.ts';
import { DropCounters } from './drops.ts';
import { BusError } from './errors.ts';
import { SupervisedLoop } from './loop.ts';
import { Outbox } from './outbox.ts';
import {
  type ControlKind,
  type ControlMessage,
  controlFrames,
  type EngineKind,
  type EngineMessage,
  encodePayload,
} from './protocol.ts';
import { type BusTransport, type DealerSocket, zmqTransport } from './transport.ts';

export interface BusClientOptions {
  /**
   * The control plane's bus endpoint, or those of every control plane sharing a journal (one
   * leads; the others have no bus until they do). With more than one, a connection that brings no
   * welcome within `failoverMs` is given up for the next endpoint, round and round.
   */
  endpoints: string[];
  /** With several endpoints: how long one may go without a welcome. Default 1000 ms. */
  failoverMs?: number;
  engine: string;
  incarnation: string;
  curve?: CurveClientKeys;
  maxFrameBytes?: number;
  /** Resend hello this often until welcomed (ms). Default 1000. */
  helloRetryMs?: number;
  log: Logger;
  /** Default: ZeroMQ. The simulator's is an in-memory network (src/sim/world/network.ts). */
  transport?: BusTransport;
  /** Default: the process's clock. */
  clock?: Clock;
  /** The secret part of each connection's routing id. Default: 96 random bits from the OS. */
  nonce?: () => string;
}

export interface BusClientHandlers {
  /** The hello to send now (its lastSeq and rooms change over time). */
  hello(): EngineMessage<'hello'>;
  welcome(msg: ControlMessage<'welcome'>): void;
  event(msg: ControlMessage<'event'>): void;
  command(msg: ControlMessage<'command'>): void;
  /** A room's KV arrived (a hint before its commit; decode engines). */
  kvArrived?(msg: ControlMessage<'kv_arrived'>): void;
  /** The control plane refused this engine for good (a non-retryable nack to its hello). */
  refused?(msg: ControlMessage<'nack'>): void;
}

export type AppendAck = ControlMessage<'ack'>;

/** How often a run of failed CURVE handshakes is logged (see `onHandshakeFailed`). */
/** A dropped connection is replaced by a new socket at most this often. */
const RECONNECT_MIN_MS = 100;
const HANDSHAKE_LOG_EVERY_MS = 10_000;
type AppendEvent = EngineMessage<'append'>['event'];

/** Whether the acked event is in the journal as applied (now, or by an earlier send of it). */
export function wasApplied(ack: AppendAck | null): boolean {
  return ack?.status === 'applied' || (ack?.status === 'duplicate' && ack.original === 'applied');
}

interface PendingAppend {
  eventId: string;
  event: AppendEvent;
  resolve(ack: AppendAck): void;
  reject(err: BusError): void;
  retryTimer: Timer | null;
}

export class BusClient {
  readonly drops: DropCounters;
  /** The current connection's receive loop; `reset` replaces it (its tick count carries over). */
  loop: SupervisedLoop;
  private socket: DealerSocket;
  private readonly clock: Clock;
  private outbox: Outbox;
  private readonly decoder;
  /** Bumped by `reset`: each generation has its own socket, routing id and receive loop. */
  private generation = 0;
  /** Whether this generation's socket completed a handshake (the ROUTER knows its routing id). */
  private handshaken = false;
  /**
   * A hello said on this socket before its handshake: it waits in the socket's queue, and one is
   * enough. Resent every second instead, a control plane back after N seconds got N hellos at
   * once, throttled them, and its ladder reset every engine in place (found by the simulator).
   */
  private helloQueued = false;
  private reconnectedAt = 0;
  resets = 0;
  private readonly pending = new Map<string, PendingAppend>();
  private helloTimer: Timer | null = null;
  private closed = false;
  /** Set by the freeze drill: the receive loop stops reading, the process lives on. */
  private frozen: Promise<void> | null = null;
  private thaw: () => void = () => {};
  /** True between a welcome and the next disconnect or hello. Appends are sent only then. */
  welcomed = false;
  /** The welcome's session, and the number of the next append sent under it. */
  private session = 0;
  private nextN = 1;
  connects = 0;
  disconnects = 0;
  /** Which of `endpoints` this connection goes to, and times the client moved on to the next. */
  private at = 0;
  failovers = 0;
  private failoverTimer: Timer | null = null;

  constructor(
    private readonly options: BusClientOptions,
    private readonly handlers: BusClientHandlers,
  ) {
    this.clock = options.clock ?? systemClock;
    this.decoder = controlFrames(options.maxFrameBytes);
    this.drops = new DropCounters(options.log, `engine ${options.engine} bus`, this.clock);
    this.socket = this.openSocket();
    this.outbox = this.newOutbox();
    this.loop = this.newLoop();
  }

  private openSocket(): DealerSocket {
    const options = this.options;
    return (options.transport ?? zmqTransport).dealer({
      routingId: connectionRoutingId(options.engine, options.incarnation, options.nonce?.()),
      // With a standby to go to, a silent (frozen) leader is given up sooner.
      heartbeatTimeoutMs: options.endpoints.length > 1 ? 2000 : 5000,
      ...(options.curve ? { curve: options.curve } : {}),
    });
  }

  private newOutbox(): Outbox {
    return new Outbox(this.socket, this.options.log, 'engine bus', this.clock);
  }

  private newLoop(): SupervisedLoop {
    const { log } = this.options;
    return new SupervisedLoop('bus.receive', (loop) => this.receive(loop), log, 100, this.clock);
  }

  /** Connection events, read one at a time while this socket is the current one. */
  private async watch(socket: DealerSocket): Promise<void> {
    while (!this.closed && socket === this.socket) {
      let ev: Awaited<ReturnType<DealerSocket['nextEvent']>>;
      try {
        ev = await socket.nextEvent();
      } catch {
        return;
      }
      if (socket !== this.socket) return;
      if (ev.type === 'handshake') this.onConnected();
      else if (ev.type === 'disconnect') this.onDisconnected();
      else if (ev.type.startsWith('handshake:error'))
        this.onHandshakeFailed(ev.type, (ev as { error?: Error }).error);
    }
  }

  /** The endpoint this connection goes to. */
  get endpoint(): string {
    return this.options.endpoints[this.at] as string;
  }

  start(): void {
    if (this.options.endpoints.length === 0) throw new Error('BusClient needs an endpoint');
    void this.watch(this.socket);
    this.socket.connect(this.endpoint);
    this.loop.start();
    this.helloOnceConnected();
    this.armFailover();
  }

  /**
   * With several endpoints: unless a welcome comes within failoverMs, move on to the next one.
   * Armed at start and on every disconnect; a welcome disarms it.
   */
  private armFailover(): void {
    if (this.options.endpoints.length < 2 || this.closed) return;
    this.clock.clear(this.failoverTimer);
    this.failoverTimer = this.clock.setTimeout(() => {
      this.failoverTimer = null;
      if (this.welcomed || this.closed) return;
      const from = this.endpoint;
      this.at = (this.at + 1) % this.options.endpoints.length;
      this.failovers++;
      this.options.log.warn(
        { from, to: this.endpoint },
        'bus: no control plane answered; trying the next endpoint',
      );
      void this.reconnectTo();
    }, this.options.failoverMs ?? 1000);
    this.failoverTimer.unref();
  }

  /**
   * The hello goes out when the connection's handshake completes (`onConnected`), once: said
   * before, it would wait in the socket's queue and arrive together with that one, and the
   * control plane would register the engine and then take it for a reconnection. The timer is a
   * fallback in case no handshake event comes, and the retry of a hello no welcome answered.
   */
  private helloOnceConnected(): void {
    this.clock.clear(this.helloTimer);
    this.helloTimer = this.clock.setTimeout(() => {
      this.helloTimer = null;
      if (!this.welcomed) this.sayHello();
    }, this.options.helloRetryMs ?? 1000);
    this.helloTimer.unref();
  }

  /**
   * The in-place rung of the escalation ladder (docs/design.md §9): abandon this connection — its
   * socket, its receive loop, whatever it had queued — and open a new one under the same
   * incarnation. The hello that follows replays what the engine missed, and unacknowledged appends
   * are resent after the welcome, so nothing is lost; the process and its model stay up. This is
   * what revives a receive loop that is stuck (docs/incident.md) without restarting anything else.
   */
  async reset(reason: string): Promise<void> {
    if (this.closed) return;
    this.resets++;
    this.options.log.warn(
      { reason, generation: this.generation + 1 },
      'bus: resetting the connection in place',
    );
    await this.reconnectTo();
  }

  /** A new socket, receive loop and hello, to `this.endpoint`; the old ones are dropped. */
  private async reconnectTo(): Promise<void> {
    if (this.closed) return;
    this.generation++;
    this.handshaken = false;
    this.helloQueued = false;
    this.reconnectedAt = this.clock.now();
    const old = { socket: this.socket, loop: this.loop };
    this.welcomed = false;
    this.socket = this.openSocket();
    this.outbox = this.newOutbox();
    this.loop = this.newLoop();
    this.loop.ticks = old.loop.ticks;
    // A frozen loop (drill) is released; it sees its loop stopped and its socket closed, and ends.
    this.frozen = null;
    this.thaw();
    const stopped = old.loop.stop();
    old.socket.close();
    void this.watch(this.socket);
    this.socket.connect(this.endpoint);
    this.loop.start();
    this.helloOnceConnected();
    this.armFailover();
    await stopped;
  }

  /**
   * A CURVE handshake that failed. `auth` is the control plane's answer that our key is not
   * allowed there: final (libzmq does not try again), so the engine is refused for good, saying
   * why. Anything else looks the same whether the network broke mid-handshake or the two sides
   * disagree on the control plane's key or on CURVE itself (the server just drops us): libzmq
   * retries, and the engine says what to check, once per `HANDSHAKE_LOG_EVERY_MS`.
   */
  private handshakeFailures = 0;
  private handshakeLoggedAt = 0;

  private onHandshakeFailed(type: string, error: Error | undefined): void {
    this.handshakeFailures++;
    if (type === 'handshake:error:auth') {
      this.handlers.refused?.({
        eventId: null,
        code: 'BUS_UNAUTHORIZED',
        message: `the control plane at ${this.endpoint} refused the CURVE handshake: it does not allow this engine’s key (give it --engine-key ID=PUBLIC, or use the key pair it issued)`,
        retryable: false,
      });
      return;
    }
    const now = this.clock.now();
    if (now - this.handshakeLoggedAt < HANDSHAKE_LOG_EVERY_MS) return;
    this.handshakeLoggedAt = now;
    this.options.log.warn(
      { type, error: error?.message, failuresInARow: this.handshakeFailures },
      'engine bus: CURVE handshakes with the control plane keep failing; if the network is fine, PDCTL_CURVE_SERVER_KEY is not the control plane’s public key, or --insecure-bus is set on one side only',
    );
  }

  private onConnected(): void {
    this.handshaken = true;
    this.handshakeFailures = 0;
    this.connects++;
    if (this.connects > 1) {
      this.options.log.info(
        { engine: this.options.engine },
        'bus: reconnected; saying hello again',
      );
    }
    this.sayHello();
  }

  /**
   * A connection that dropped is not resumed on its socket: the control plane's ROUTER may still
   * hold the old connection under its routing id (it gives a routing id to no second connection
   * while the first lives), so the engine comes back on a new socket with a new routing id.
   */
  private onDisconnected(): void {
    this.disconnects++;
    this.welcomed = false;
    this.options.log.warn({ endpoint: this.endpoint }, 'bus: lost the control plane; reconnecting');
    // A connection that never finished its handshake was never known to the ROUTER: libzmq's own
    // reconnect (with its back-off) is fine for it.
    if (!this.handshaken) {
      this.armFailover();
      return;
    }
    // At most one new socket per RECONNECT_MIN_MS, however fast connections drop.
    const socket = this.socket;
    const wait = Math.max(0, this.reconnectedAt + RECONNECT_MIN_MS - this.clock.now());
    this.clock
      .setTimeout(() => {
        if (this.socket === socket) void this.reconnectTo();
      }, wait)
      .unref();
  }

  /** Sends hello now and again every helloRetryMs until a welcome arrives. */
  sayHello(): void {
    if (this.closed) return;
    this.welcomed = false;
    if (!this.handshaken && this.helloQueued) {
      this.helloOnceConnected();
      return;
    }
    this.helloQueued ||= !this.handshaken;
    this.send('hello', this.handlers.hello());
    this.helloOnceConnected();
  }

  private async receive(loop: SupervisedLoop): Promise<void> {
    const socket = this.socket;
    while (loop.shouldRun && !this.closed) {
      if (this.frozen) await this.frozen;
      if (!loop.shouldRun) return;
      let frames: Buffer[];
      try {
        frames = await socket.receive();
      } catch (err) {
        if (this.closed || !loop.shouldRun) return;
        throw err;
      }
      loop.tick();
      for (const d of this.decoder.decodeAll(frames)) {
        if (!d.ok) {
          this.drops.record(d.reason, { kind: d.kind, detail: d.detail });
          continue;
        }
        try {
          this.dispatch(d.kind, d.payload);
        } catch (err) {
          this.options.log.error(
            { err, kind: d.kind },
            'engine bus: handler threw; message dropped',
          );
        }
      }
    }
  }

  private dispatch(kind: ControlKind, payload: Record<string, unknown>): void {
    switch (kind) {
      case 'welcome': {
        const w = payload as ControlMessage<'welcome'>;
        this.welcomed = true;
        this.clock.clear(this.failoverTimer);
        this.failoverTimer = null;
        this.session = w.session;
        this.nextN = 1;
        this.clock.clear(this.helloTimer);
        this.helloTimer = null;
        this.handlers.welcome(w);
        // Appends never acknowledged may have been lost with the old connection: send them all
        // again, in their order, numbered in the new session.
        for (const p of this.pending.values()) this.sendAppend(p);
        return;
      }
      case 'ack': {
        const ack = payload as AppendAck;
        const p = this.pending.get(ack.eventId);
        if (!p) {
          this.drops.record('duplicate', { kind, eventId: ack.eventId });
          return;
        }
        this.pending.delete(ack.eventId);
        this.clock.clear(p.retryTimer);
        p.resolve(ack);
        return;
      }
      case 'nack': {
        const nack = payload as ControlMessage<'nack'>;
        const p = nack.eventId === null ? undefined : this.pending.get(nack.eventId);
        if (!p) {
          this.options.log.warn({ code: nack.code, message: nack.message }, 'engine bus: nack');
          if (nack.code === 'BUS_NOT_REGISTERED') this.sayHello();
          else if (!nack.retryable && nack.eventId === null) this.handlers.refused?.(nack);
          return;
        }
        if (nack.retryable) {
          // Not registered (or a gap in our append stream): a new session resends everything.
          if (nack.code === 'BUS_NOT_REGISTERED') this.sayHello();
          else if (!p.retryTimer) {
            p.retryTimer = this.clock.setTimeout(() => {
              p.retryTimer = null;
              if (this.pending.has(p.eventId) && this.welcomed) this.sendAppend(p);
            }, 250);
          }
          return;
        }
        this.pending.delete(p.eventId);
        p.reject(new BusError(nack.code, nack.message));
        return;
      }
      case 'event':
        this.handlers.event(payload as ControlMessage<'event'>);
        return;
      case 'command':
        this.handlers.command(payload as ControlMessage<'command'>);
        return;
      case 'kv_arrived':
        this.handlers.kvArrived?.(payload as ControlMessage<'kv_arrived'>);
        return;
    }
  }

  /**
   * Sends an event for the control plane to validate, journal and commit. Resolves with the ack
   * (applied, rejected or duplicate) once committed; kept and resent across reconnects until then.
   */
  append(eventId: string, event: AppendEvent): Promise<AppendAck> {
    if (this.closed) return Promise.reject(new BusError('BUS_CLOSED', 'the bus client is closed'));
    return new Promise((resolve, reject) => {
      const p: PendingAppend = { eventId, event, resolve, reject, retryTimer: null };
      this.pending.set(eventId, p);
      // Before a welcome it waits: the welcome sends every pending append, in order.
      if (this.welcomed) this.sendAppend(p);
    });
  }

  private sendAppend(p: PendingAppend): void {
    this.send('append', {
      eventId: p.eventId,
      session: this.session,
      n: this.nextN++,
      event: p.event,
    });
  }

  send<K extends EngineKind>(kind: K, payload: EngineMessage<K>): void {
    if (this.closed) return;
    this.outbox.push(null, kind, encodePayload(payload));
  }

  get unacked(): number {
    return this.pending.size;
  }

  get outboxDepth(): number {
    return this.outbox.depth;
  }

  /**
   * Drill hook: the receive loop stops consuming (as the transfer thread of docs/incident.md did) while
   * everything else — heartbeats included — goes on. Only `close` ends it.
   */
  freezeReceiveForDrill(): void {
    this.options.log.warn({}, 'drill: bus receive loop frozen');
    this.frozen ??= new Promise((r) => (this.thaw = r));
  }

  close(): Promise<void> {
    if (this.closed) return Promise.resolve();
    this.closed = true;
    this.thaw();
    this.clock.clear(this.helloTimer);
    this.clock.clear(this.failoverTimer);
    for (const p of this.pending.values()) {
      this.clock.clear(p.retryTimer);
      p.reject(
        new BusError('BUS_CLOSED', 'the bus client closed before the append was acknowledged'),
      );
    }
    this.pending.clear();
    const stopping = this.loop.stop();
    this.socket.close();
    return stopping;
  }
}
