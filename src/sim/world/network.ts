/**
 * The simulator's network (issue 41): the bus transport port (transport.ts) in memory, on a
 * `Clock`, so that a whole fleet runs in one process and a run is a function of its seed. It
 * keeps what ZeroMQ over TCP gives the bus, and nothing more:
 *
 * - a DEALER connects to a bound ROUTER after a link delay and says so (`handshake`); it keeps
 *   trying every 100 ms while nothing listens or the link is down, and queues what it sends
 *   until connected;
 * - messages of one connection arrive in order, each after the link's delay; a ROUTER's send to a
 *   routing id with no connection fails EHOSTUNREACH; a second connection under a routing id that
 *   is connected is refused (handover off);
 * - a closed socket ends its connections at once: the peer DEALER hears `disconnect`;
 * - a link set down (`partition`) holds what is sent across it; healed within the DEALER's
 *   heartbeat timeout, the connection lives and the held messages arrive; otherwise both ends drop
 *   it, what was held is lost, and the DEALER hears `disconnect`.
 *
 * Beyond TCP, a link may lose, duplicate or reorder messages (`setLink`): faults a connection that
 * dies with messages in it looks like to the protocol above (gaps, resends), found by seeds.
 *
 * Each process of a simulated fleet takes its sockets from `network.host(name)`; links join hosts.
 */

import type {
  BusTransport,
  DealerEvent,
  DealerSocket,
  DealerSpec,
  Frames,
  RouterSocket,
  RouterSpec,
} from '../../bus/transport.ts';
import type { Clock } from '../../ports/clock.ts';
import type { Random } from '../../ports/random.ts';

/** How a link between two hosts behaves; both directions alike. */
export interface LinkSpec {
  /** One-way delay, drawn uniformly in [min, max] ms for each message. */
  delayMs: readonly [number, number];
  /** Chance that a message is lost. */
  loss: number;
  /** Chance that a message arrives twice. */
  duplicate: number;
  /** Chance that a message may overtake the ones sent before it. */
  reorder: number;
  /** False: a partition. */
  up: boolean;
}

const DEFAULT_LINK: LinkSpec = { delayMs: [1, 1], loss: 0, duplicate: 0, reorder: 0, up: true };
const RECONNECT_MS = 100;

/** A waiting `receive` or `nextEvent`: a queue of items and at most one taker. */
class Inbox<T> {
  private readonly items: T[] = [];
  private taker: { resolve: (v: T) => void; reject: (e: Error) => void } | null = null;
  private closed = false;

  push(item: T): void {
    if (this.closed) return;
    const t = this.taker;
    if (t) {
      this.taker = null;
      t.resolve(item);
    } else this.items.push(item);
  }

  take(): Promise<T> {
    if (this.closed) return Promise.reject(closedError());
    if (this.items.length > 0) return Promise.resolve(this.items.shift() as T);
    if (this.taker) return Promise.reject(new Error('one receive at a time'));
    return new Promise((resolve, reject) => {
      this.taker = { resolve, reject };
    });
  }

  close(): void {
    this.closed = true;
    this.items.length = 0;
    const t = this.taker;
    this.taker = null;
    t?.reject(closedError());
  }
}

function closedError(): Error {
  return Object.assign(new Error('socket closed'), { code: 'ENOTSOCK' });
}

/** One DEALER–ROUTER connection; messages carry its number, and die with it. */
interface Connection {
  id: number;
  dealer: MemoryDealer;
  router: MemoryRouter;
  routingId: string;
  /** Messages sent while the link was down, delivered when it heals. */
  held: Array<() => void>;
  /** When a message last left in each direction: one connection's messages keep their order. */
  lastAt: { up: number; down: number };
  /** Set when the link went down: the heartbeat timeout that drops the connection. */
  timeout: ReturnType<Clock['setTimeout']> | null;
  open: boolean;
}

export class MemoryNetwork {
  private readonly links = new Map<string, LinkSpec>();
  private readonly listeners = new Map<string, MemoryRouter>();
  private readonly connections = new Set<Connection>();
  private readonly sockets = new Map<string, Set<MemoryRouter | MemoryDealer>>();
  private nextConnection = 1;
  private nextPort = 1;
  /** Messages moved, lost and duplicated, for a run's report. */
  readonly stats = { delivered: 0, lost: 0, duplicated: 0, dropped: 0 };

  constructor(
    readonly clock: Clock,
    private readonly random: Random,
    private readonly defaults: LinkSpec = DEFAULT_LINK,
  ) {}

  /** The sockets of one host (a process of the fleet). */
  host(name: string): BusTransport {
    const track = <S extends MemoryRouter | MemoryDealer>(socket: S): S => {
      const all = this.sockets.get(name) ?? new Set();
      all.add(socket);
      this.sockets.set(name, all);
      return socket;
    };
    return {
      router: (spec) => track(new MemoryRouter(this, name, spec)),
      dealer: (spec) => track(new MemoryDealer(this, name, spec)),
    };
  }

  /** The host's process died: its sockets close at once, and its peers see their connections end. */
  kill(name: string): void {
    for (const socket of this.sockets.get(name) ?? []) socket.close();
    this.sockets.delete(name);
  }

  link(a: string, b: string): LinkSpec {
    return this.links.get(key(a, b)) ?? this.defaults;
  }

  /** Changes how the link between `a` and `b` behaves (both directions). */
  setLink(a: string, b: string, change: Partial<LinkSpec>): void {
    const before = this.link(a, b);
    const after = { ...before, ...change };
    this.links.set(key(a, b), after);
    if (before.up === after.up) return;
    for (const c of this.connections) {
      if (key(c.dealer.host, c.router.host) !== key(a, b)) continue;
      if (!after.up) {
        c.timeout ??= this.clock.setTimeout(() => this.drop(c), c.dealer.spec.heartbeatTimeoutMs);
      } else {
        this.clock.clear(c.timeout);
        c.timeout = null;
        const held = c.held.splice(0);
        for (const send of held) send();
      }
    }
  }

  partition(a: string, b: string): void {
    this.setLink(a, b, { up: false });
  }

  heal(a: string, b: string): void {
    this.setLink(a, b, { up: true });
  }

  // ── what the sockets call ──

  bind(router: MemoryRouter, endpoint: string): string {
    const m = /^(tcp|ipc|mem):\/\/(.+)$/.exec(endpoint);
    if (!m) throw Object.assign(new Error(`cannot bind ${endpoint}`), { code: 'EINVAL' });
    const name = m[2]?.endsWith(':0')
      ? `mem://${router.host}:${this.nextPort++}`
      : `mem://${m[2] as string}`;
    if (this.listeners.has(name))
      throw Object.assign(new Error(`address in use: ${name}`), { code: 'EADDRINUSE' });
    this.listeners.set(name, router);
    return name;
  }

  unbind(router: MemoryRouter): void {
    for (const [name, r] of this.listeners) if (r === router) this.listeners.delete(name);
    for (const c of [...this.connections]) if (c.router === router) this.drop(c);
  }

  /** One attempt of `dealer` to connect to `endpoint`; it tries again until it is connected. */
  dial(dealer: MemoryDealer, endpoint: string): void {
    const attempt = () => {
      if (dealer.closed || dealer.connection) return;
      const router = this.listeners.get(normalize(endpoint));
      const taken =
        router &&
        [...this.connections].some(
          (c) => c.router === router && c.routingId === dealer.spec.routingId,
        );
      if (!router || router.closed || taken || !this.link(dealer.host, router.host).up) {
        this.clock.setTimeout(attempt, RECONNECT_MS);
        return;
      }
      const c: Connection = {
        id: this.nextConnection++,
        dealer,
        router,
        routingId: dealer.spec.routingId,
        held: [],
        lastAt: { up: 0, down: 0 },
        timeout: null,
        open: true,
      };
      this.connections.add(c);
      router.peers.set(c.routingId, c);
      dealer.connected(c);
    };
    this.clock.setTimeout(
      attempt,
      this.delay(dealer.host, this.listeners.get(normalize(endpoint))?.host),
    );
  }

  /** Moves one message along `c`, after the link's delay, unless the link loses it. */
  carry(c: Connection, direction: 'up' | 'down', frames: Buffer[]): void {
    const link = this.link(c.dealer.host, c.router.host);
    const send = () => {
      if (!c.open) return;
      if (this.random.chance(link.loss)) {
        this.stats.lost++;
        return;
      }
      const copies = this.random.chance(link.duplicate) ? 2 : 1;
      if (copies === 2) this.stats.duplicated++;
      for (let i = 0; i < copies; i++) this.schedule(c, direction, frames, link);
    };
    if (!link.up) c.held.push(send);
    else send();
  }

  private schedule(
    c: Connection,
    direction: 'up' | 'down',
    frames: Buffer[],
    link: LinkSpec,
  ): void {
    const now = this.clock.now();
    let at = now + this.draw(link);
    // One connection's messages keep their order unless the link reorders this one.
    if (!this.random.chance(link.reorder)) at = Math.max(at, c.lastAt[direction]);
    c.lastAt[direction] = Math.max(c.lastAt[direction], at);
    this.clock.setTimeout(() => {
      if (!c.open) {
        this.stats.dropped++;
        return;
      }
      this.stats.delivered++;
      if (direction === 'up') c.router.deliver([Buffer.from(c.routingId, 'latin1'), ...frames]);
      else c.dealer.deliver(frames);
    }, at - now);
  }

  /** Ends a connection: what it carried is lost; the DEALER hears `disconnect` and dials again. */
  drop(c: Connection): void {
    if (!c.open) return;
    c.open = false;
    this.clock.clear(c.timeout);
    this.connections.delete(c);
    if (c.router.peers.get(c.routingId) === c) c.router.peers.delete(c.routingId);
    c.dealer.disconnected(c);
  }

  private delay(a: string, b: string | undefined): number {
    return this.draw(b === undefined ? this.defaults : this.link(a, b));
  }

  private draw(link: LinkSpec): number {
    const [lo, hi] = link.delayMs;
    return lo + (hi - lo) * this.random.next();
  }
}

function key(a: string, b: string): string {
  return a < b ? `${a}|${b}` : `${b}|${a}`;
}

function normalize(endpoint: string): string {
  return endpoint.replace(/^(tcp|ipc):\/\//, 'mem://');
}

function framesOf(frames: Frames): Buffer[] {
  return frames.map((f) => (typeof f === 'string' ? Buffer.from(f) : Buffer.from(f)));
}

/** What both socket kinds share: the messages waiting to be received, and closing once. */
abstract class MemorySocket {
  private readonly inbox = new Inbox<Buffer[]>();
  closed = false;

  receive(): Promise<Buffer[]> {
    return this.inbox.take();
  }

  deliver(frames: Buffer[]): void {
    this.inbox.push(frames);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.inbox.close();
    this.ended();
  }

  /** What closing ends beside the inbox: the socket's connections. */
  protected abstract ended(): void;
}

export class MemoryRouter extends MemorySocket implements RouterSocket {
  readonly peers = new Map<string, Connection>();
  lastEndpoint: string | null = null;

  constructor(
    private readonly network: MemoryNetwork,
    readonly host: string,
    spec: RouterSpec,
  ) {
    super();
    if (spec.curve)
      throw new Error('the in-memory network has no CURVE: run the simulated bus without it');
  }

  async bind(endpoint: string): Promise<void> {
    this.lastEndpoint = this.network.bind(this, endpoint);
  }

  async send(frames: Frames): Promise<void> {
    if (this.closed) throw closedError();
    const [id, ...rest] = framesOf(frames);
    const c = id === undefined ? undefined : this.peers.get(id.toString('latin1'));
    if (!c) throw Object.assign(new Error('Host unreachable'), { code: 'EHOSTUNREACH' });
    this.network.carry(c, 'down', rest);
  }

  protected ended(): void {
    this.network.unbind(this);
  }
}

export class MemoryDealer extends MemorySocket implements DealerSocket {
  connection: Connection | null = null;
  private readonly events = new Inbox<DealerEvent>();
  /** Sent before the connection: it leaves once connected, as ZeroMQ's queue does. */
  private readonly queued: Buffer[][] = [];
  private endpoint: string | null = null;

  constructor(
    private readonly network: MemoryNetwork,
    readonly host: string,
    readonly spec: DealerSpec,
  ) {
    super();
    if (spec.curve)
      throw new Error('the in-memory network has no CURVE: run the simulated bus without it');
  }

  connect(endpoint: string): void {
    this.endpoint = endpoint;
    this.network.dial(this, endpoint);
  }

  async send(frames: Frames): Promise<void> {
    if (this.closed) throw closedError();
    const message = framesOf(frames);
    if (this.connection) this.network.carry(this.connection, 'up', message);
    else this.queued.push(message);
  }

  nextEvent(): Promise<DealerEvent> {
    return this.events.take();
  }

  connected(c: Connection): void {
    this.connection = c;
    this.events.push({ type: 'handshake' });
    for (const m of this.queued.splice(0)) this.network.carry(c, 'up', m);
  }

  disconnected(c: Connection): void {
    if (this.connection !== c) return;
    this.connection = null;
    if (this.closed) return;
    this.events.push({ type: 'disconnect' });
    if (this.endpoint !== null) this.network.dial(this, this.endpoint);
  }

  protected ended(): void {
    this.events.close();
    if (this.connection) this.network.drop(this.connection);
  }
}
