/**
 * The bus transport port (issue 41): the two socket kinds the bus is built on — the control
 * plane's ROUTER and each engine's DEALER — as interfaces with two adapters. `zmqTransport` is
 * ZeroMQ (production, the e2e tests, the drills); `MemoryNetwork` (src/sim/world/network.ts) is the
 * simulator's network, on a virtual clock, with per-link delay, loss, duplication, reordering and
 * partitions. The server and client (server.ts, client.ts) hold the protocol; a transport only
 * moves frames and reports connections.
 */
import * as zmq from 'zeromq';
import { checkKey } from './admission.ts';
import type { CurveClientKeys } from './curve.ts';

export type Frames = Array<Buffer | string>;

export interface BusSocket {
  readonly closed: boolean;
  /** Queues one message; rejects with `code: 'EHOSTUNREACH'` for a ROUTER peer that is gone. */
  send(frames: Frames): Promise<void>;
  /** The next message; one call at a time. Rejects once the socket is closed. */
  receive(): Promise<Buffer[]>;
  close(): void;
}

/** The control plane's socket: messages arrive as [routing id, ...frames], and go out the same way. */
export interface RouterSocket extends BusSocket {
  bind(endpoint: string): Promise<void>;
  /** The endpoint bound, with the port a `:0` was given. */
  readonly lastEndpoint: string | null;
}

/** A connection event of a DEALER. */
export interface DealerEvent {
  /** `handshake` (connected), `disconnect`, or `handshake:error:*` (CURVE refused or failed). */
  type: string;
  error?: Error;
}

/** An engine's socket, connected to one ROUTER; it reconnects by itself after a drop. */
export interface DealerSocket extends BusSocket {
  connect(endpoint: string): void;
  /** The next connection event; rejects once the socket is closed. */
  nextEvent(): Promise<DealerEvent>;
}

export interface RouterSpec {
  /** Largest message libzmq takes before it drops the connection. */
  maxMessageSize: number;
  curve?: { secretKey: string; publicKey: string; zapDomain: boolean };
}

export interface DealerSpec {
  /** Who the ROUTER sees; never given to a second connection while the first lives. */
  routingId: string;
  /** A connection silent this long is dropped (a frozen or partitioned peer). */
  heartbeatTimeoutMs: number;
  curve?: CurveClientKeys;
}

export interface BusTransport {
  router(spec: RouterSpec): RouterSocket;
  dealer(spec: DealerSpec): DealerSocket;
}

/** ZeroMQ: the transport of every real process. */
export const zmqTransport: BusTransport = Object.freeze({
  router(spec: RouterSpec): RouterSocket {
    // Handover stays off: with it on, any peer that connects under a live engine's routing id
    // takes its messages over.
    const socket = new zmq.Router({
      mandatory: true,
      handover: false,
      maxMessageSize: spec.maxMessageSize,
      heartbeatInterval: 1000,
      heartbeatTimeout: 5000,
      linger: 0,
      sendHighWaterMark: 100_000,
    });
    if (spec.curve) {
      socket.curveServer = true;
      socket.curveSecretKey = checkKey('curve secret key', spec.curve.secretKey);
      socket.curvePublicKey = checkKey('curve public key', spec.curve.publicKey);
      if (spec.curve.zapDomain) socket.zapDomain = 'pdctl';
    }
    return socket;
  },

  dealer(spec: DealerSpec): DealerSocket {
    const socket = new zmq.Dealer({
      routingId: spec.routingId,
      heartbeatInterval: 1000,
      heartbeatTimeout: spec.heartbeatTimeoutMs,
      reconnectInterval: 100,
      reconnectMaxInterval: 1000,
      linger: 0,
      maxMessageSize: 256 << 20,
      sendHighWaterMark: 100_000,
    });
    if (spec.curve) {
      socket.curveServerKey = checkKey('control plane public key', spec.curve.serverKey);
      socket.curvePublicKey = checkKey('engine public key', spec.curve.publicKey);
      socket.curveSecretKey = checkKey('engine secret key', spec.curve.secretKey);
    }
    return new ZmqDealer(socket);
  },
});

/**
 * A ZeroMQ DEALER as the port has it. Its events are read one at a time by the caller's own loop:
 * zeromq.js's `events.on()` runs a loop of its own whose rejection on socket close is never
 * caught, which would crash the process.
 */
class ZmqDealer implements DealerSocket {
  /** Observed from the start: events that come before the observer exists are not reported. */
  private readonly events: zmq.Dealer['events'];

  constructor(private readonly socket: zmq.Dealer) {
    this.events = socket.events;
  }

  get closed(): boolean {
    return this.socket.closed;
  }

  connect(endpoint: string): void {
    this.socket.connect(endpoint);
  }

  send(frames: Frames): Promise<void> {
    return this.socket.send(frames);
  }

  receive(): Promise<Buffer[]> {
    return this.socket.receive();
  }

  async nextEvent(): Promise<DealerEvent> {
    return this.events.receive();
  }

  close(): void {
    this.socket.close();
  }
}
