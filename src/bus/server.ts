/**
 * The control plane's end of the bus: one ROUTER that engines connect DEALERs to. This file owns
 * the socket, the receive loop and frame validation; what a message means (appends, replay,
 * routing of committed events) is the control plane's business (src/control/). Nothing a peer
 * sends can stop the receive loop: bad frames are counted, logged at a rate limit, and dropped or
 * nacked, and the loop runs under a supervisor.
 */
import type { Logger } from '../log.ts';
import { type Clock, systemClock } from '../ports/clock.ts';
import { type CurveServerKeys, ZapHandler } from './curve.ts';
import { DropCounters } from './drops.ts';
import { BusError } from './errors.ts';
import { SupervisedLoop } from './loop.ts';
import { Outbox } from './outbox.ts';
import {
  type ControlKind,
  type ControlMessage,
  type DropReason,
  type EngineKind,
  type EngineMessage,
  encodePayload,
  engineFrames,
} from './protocol.ts';
import { type PeerQuotaOptions, PeerQuotas, type QuotaKind } from './quotas.ts';
import { type BusTransport, type RouterSocket, zmqTransport } from './transport.ts';

export interface BusServerOptions {
  /** `tcp://127.0.0.1:0` picks a free port; `ipc:///path` for a Unix socket. */
  endpoint: string;
  /** Largest payload accepted (default 1 MiB); larger frames are counted as `too_large`. */
  maxFrameBytes?: number;
  curve?: CurveServerKeys;
  log: Logger;
  /** Default: ZeroMQ. The simulator's is an in-memory network (src/sim/world/network.ts). */
  transport?: BusTransport;
  /** Default: the process's clock. */
  clock?: Clock;
}

/**
 * A connected peer, named by its connection's routing id. The ROUTER never hands a routing id
 * over to a second connection while the first is connected (handover off), so messages for a
 * peer reach the connection that said its hello, and no other; engines pick a fresh routing id
 * with 96 random bits for every connection, which nobody else can guess (docs/security.md).
 */
export type PeerId = string;

export interface BusServerHandlers {
  hello(peer: PeerId, msg: EngineMessage<'hello'>): void;
  /** Only from peers accepted with `register`. */
  heartbeat(peer: PeerId, engine: string, msg: EngineMessage<'heartbeat'>): void;
  append(peer: PeerId, engine: string, msg: EngineMessage<'append'>): void;
  tokens(peer: PeerId, engine: string, msg: EngineMessage<'tokens'>): void;
  /**
   * Whether a peer that is not registered may never be again (its incarnation was fenced): null
   * when not; else why, and whether to tell it now. Its messages are answered BUS_FENCED (at most
   * once a second: a fenced peer flooding frames gets no answer to each) and otherwise dropped.
   */
  fenced?(peer: PeerId): { reason: string; tell: boolean } | null;
  /**
   * A peer ran over one of its quotas: its messages are dropped until it keeps within them. Called
   * once per episode (the first drop after 10 s within quota), with the engine it registered as.
   */
  throttled?(peer: PeerId, engine: string | null, kind: QuotaKind, quotas: PeerQuotaOptions): void;
}

export interface BusStatus {
  endpoint: string;
  loop: { ticks: number; restarts: number; running: boolean };
  dropped: Partial<Record<DropReason, number>>;
  outbox: number;
  zapDenied: number;
  /** Frames received from engines and sent to them (a batch is one frame) since the start. */
  frames: { received: number; sent: number };
}

export class BusServer {
  readonly drops: DropCounters;
  readonly loop: SupervisedLoop;
  private readonly socket: RouterSocket;
  private readonly clock: Clock;
  private readonly outbox: Outbox;
  private readonly decoder;
  /** Peers that said hello and were accepted, and the engine each one is. */
  private readonly registered = new Map<PeerId, string>();
  private readonly quotas: PeerQuotas;
  private zap: ZapHandler | null = null;
  /** Set by `listen`: the receive loop starts only after. */
  private handlers!: BusServerHandlers;
  private listening = false;
  private closed = false;
  received = 0;
  endpoint = '';

  /** A server not yet bound: `listen` binds it and starts receiving. */
  constructor(private readonly options: BusServerOptions) {
    const log = options.log;
    const clock = options.clock ?? systemClock;
    this.clock = clock;
    this.decoder = engineFrames(options.maxFrameBytes);
    this.drops = new DropCounters(log, 'bus', clock);
    this.quotas = new PeerQuotas();
    const { curve } = options;
    // libzmq's own cap sits far above ours so that oversized frames reach us and are counted,
    // while a multi-gigabyte frame still cannot exhaust memory.
    this.socket = (options.transport ?? zmqTransport).router({
      maxMessageSize: Math.max(64 << 20, this.decoder.maxFrameBytes * 4),
      ...(curve
        ? {
            curve: {
              secretKey: curve.secretKey,
              publicKey: curve.publicKey,
              zapDomain: curve.allow !== undefined,
            },
          }
        : {}),
    });
    this.outbox = new Outbox(this.socket, log, 'bus', clock);
    this.loop = new SupervisedLoop('bus.receive', (loop) => this.receive(loop), log, 100, clock);
  }

  static async bind(options: BusServerOptions, handlers: BusServerHandlers): Promise<BusServer> {
    const server = new BusServer(options);
    await server.listen(handlers);
    return server;
  }

  /** Binds the endpoint and hands every frame received from now on to `handlers`. */
  async listen(handlers: BusServerHandlers): Promise<void> {
    const { options } = this;
    if (this.listening) throw new Error('the bus server is already listening');
    this.listening = true;
    this.handlers = handlers;
    if (options.curve?.allow) this.zap = await ZapHandler.start(options.curve.allow, options.log);
    try {
      await this.socket.bind(options.endpoint);
    } catch (err) {
      this.socket.close();
      this.zap?.close();
      throw new BusError(
        'BUS_BIND_FAILED',
        `cannot bind the bus on ${options.endpoint}: ${(err as Error).message}; pass another --bus endpoint (tcp://127.0.0.1:0 takes any free port, for engines that serve starts itself)`,
        { cause: err },
      );
    }
    this.endpoint = this.socket.lastEndpoint ?? options.endpoint;
    this.loop.start();
  }

  private async receive(loop: SupervisedLoop): Promise<void> {
    while (loop.shouldRun && !this.closed) {
      let frames: Buffer[];
      try {
        frames = await this.socket.receive();
      } catch (err) {
        if (this.closed) return;
        throw err;
      }
      loop.tick();
      this.received++;
      this.dispatch(frames);
    }
  }

  private dispatch(frames: Buffer[]): void {
    const id = frames[0];
    if (!id) return;
    const peer = id.toString('latin1');
    // Charged before anything is decoded, so that a flood costs a lookup per message.
    const hello = frames.length === 3 && frames[1]?.equals(HELLO_KIND) === true;
    if (!this.charge(peer, 1, hello ? 1 : 0)) return;
    let all: ReturnType<typeof this.decoder.decodeAll>;
    try {
      all = this.decoder.decodeAll(frames.slice(1));
    } catch (err) {
      this.drops.record('bad_payload', { peer: printablePeer(peer), detail: String(err) });
      return;
    }
    if (all.length > 1) {
      const hellos = all.filter((d) => d.ok && d.kind === 'hello').length;
      if (!this.charge(peer, all.length - 1, hellos)) return;
    }
    for (const d of all) this.handle(peer, d);
  }

  private charge(peer: PeerId, count: number, hellos: number): boolean {
    const verdict = this.quotas.admit(peer, count, hellos, this.clock.now());
    if (verdict.ok) return true;
    const engine = this.registered.get(peer) ?? null;
    this.drops.record('rate_limited', { peer: printablePeer(peer), engine, quota: verdict.kind });
    if (verdict.first) {
      try {
        this.handlers.throttled?.(peer, engine, verdict.kind, this.quotas.options);
      } catch (err) {
        this.options.log.error({ err, engine }, 'bus: throttled handler threw');
      }
    }
    return false;
  }

  private handle(peer: PeerId, d: ReturnType<typeof this.decoder.decode>): void {
    if (!d.ok) {
      this.drops.record(d.reason, { peer: printablePeer(peer), kind: d.kind, detail: d.detail });
      if (d.kind === 'append') this.nackMalformed(peer, d.reason === 'too_large', d.detail);
      return;
    }
    const engine = this.registered.get(peer);
    try {
      if (d.kind === 'hello') {
        this.handlers.hello(peer, d.payload as EngineMessage<'hello'>);
        return;
      }
      if (engine === undefined) {
        this.drops.record('not_registered', { peer: printablePeer(peer), kind: d.kind });
        const fenced = this.handlers.fenced?.(peer) ?? null;
        if (fenced !== null) {
          // Heartbeats too: a fenced engine that only heartbeats must learn it, and exit.
          if (fenced.tell)
            this.send(peer, 'nack', {
              eventId: null,
              code: 'BUS_FENCED',
              message: fenced.reason,
              retryable: false,
            });
          return;
        }
        if (d.kind === 'append') {
          this.send(peer, 'nack', {
            eventId: (d.payload as EngineMessage<'append'>).eventId,
            code: 'BUS_NOT_REGISTERED',
            message: 'say hello first',
            retryable: true,
          });
        }
        return;
      }
      if (d.kind === 'heartbeat') {
        this.handlers.heartbeat(peer, engine, d.payload as EngineMessage<'heartbeat'>);
      } else if (d.kind === 'append') {
        this.handlers.append(peer, engine, d.payload as EngineMessage<'append'>);
      } else {
        this.handlers.tokens(peer, engine, d.payload as EngineMessage<'tokens'>);
      }
    } catch (err) {
      // A handler bug must not stop the loop that every engine depends on (docs/incident.md).
      this.options.log.error({ err, kind: d.kind, engine }, 'bus: handler threw; message dropped');
    }
  }

  private nackMalformed(peer: PeerId, tooLarge: boolean, detail: string): void {
    this.send(peer, 'nack', {
      eventId: null,
      code: tooLarge ? 'BUS_FRAME_TOO_LARGE' : 'BUS_MALFORMED_FRAME',
      message: `malformed append: ${detail}`.slice(0, 2000),
      retryable: false,
    });
  }

  /** Accepts a peer after its hello; a later peer for the same engine replaces it. */
  register(peer: PeerId, engine: string): void {
    for (const [p, e] of this.registered) if (e === engine && p !== peer) this.registered.delete(p);
    this.registered.set(peer, engine);
  }

  unregister(peer: PeerId): void {
    this.registered.delete(peer);
  }

  /**
   * Queues a message to a peer. `lazy`: the peer acts on it no sooner for having it now, so it may
   * wait (up to LAZY_MS) for a message to that peer that is not lazy, and share its frame.
   */
  send<K extends ControlKind>(
    peer: PeerId,
    kind: K,
    payload: ControlMessage<K>,
    lazy = false,
  ): void {
    if (this.closed) return;
    this.outbox.push(Buffer.from(peer, 'latin1'), kind, encodePayload(payload), lazy);
  }

  /** The bus as operators see it: endpoint, receive loop, frames dropped by reason, outbox, frames moved. */
  status(): BusStatus {
    return {
      endpoint: this.endpoint,
      loop: this.loop.stats(),
      dropped: this.drops.snapshot(),
      outbox: this.outboxDepth,
      zapDenied: this.zapDenied,
      frames: { received: this.received, sent: this.outbox.sent },
    };
  }

  get outboxDepth(): number {
    return this.outbox.depth;
  }

  get zapDenied(): number {
    return this.zap?.denied ?? 0;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    const stopping = this.loop.stop();
    this.socket.close();
    this.zap?.close();
    await stopping;
  }
}

const HELLO_KIND = Buffer.from('hello', 'latin1');
const ROUTING_NONCE_RE = /\/[0-9a-f]{24}$/;

/** A peer for the log: an engine's routing id without its random part, which stays secret. */
function printablePeer(peer: string): string {
  return peer
    .replace(ROUTING_NONCE_RE, '/…')
    .replace(/[^\x20-\x7e]/g, '?')
    .slice(0, 64);
}

export type { EngineKind };
