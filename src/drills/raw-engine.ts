/**
 * A hand-driven engine on a real ZeroMQ DEALER, for the hostile-peer drill and the tests that play
 * a peer frame by frame (a hostile one, or one that misbehaves on purpose): it connects with CURVE
 * keys when given, says a signed hello, and reads the control plane's replies as one sequence.
 */
import { encode } from 'msgpackr';
import * as zmq from 'zeromq';
import { connectionRoutingId, type KeyPair, signHello } from '../bus/admission.ts';
import { controlFrames, PROTOCOL_VERSION } from '../bus/protocol.ts';
import type { EngineSession } from '../control/engines/engine-session.ts';

export type Reply = ReturnType<ReturnType<typeof controlFrames>['decode']>;

export interface RawEngineOptions {
  endpoint: string;
  engine: string;
  role: 'prefill' | 'decode';
  incarnation?: string;
  /** The key pair it holds; with `serverKey`, also used for CURVE. */
  keys?: KeyPair;
  serverKey?: string;
  /** Connect with CURVE (needs keys and serverKey). Default true when both are given. */
  curve?: boolean;
  /** The model it claims to run (`hello.model`); null or absent: the built-in one. */
  model?: string | null;
  /** The routing id its DEALER connects under; default: a fresh one, as a real engine makes. */
  routingId?: string;
}

export class RawEngine {
  readonly socket: zmq.Dealer;
  private beats = 0;
  private readonly decoder = controlFrames();
  private readonly inbox: Reply[] = [];
  readonly incarnation: string;
  private n = 0;
  session = 0;

  constructor(readonly o: RawEngineOptions) {
    this.incarnation = o.incarnation ?? `raw-${Math.random().toString(36).slice(2)}`;
    this.socket = new zmq.Dealer({
      linger: 0,
      routingId: o.routingId ?? connectionRoutingId(o.engine, this.incarnation),
    });
    if ((o.curve ?? true) && o.keys && o.serverKey) {
      this.socket.curveServerKey = o.serverKey;
      this.socket.curvePublicKey = o.keys.publicKey;
      this.socket.curveSecretKey = o.keys.secretKey;
    }
    this.socket.connect(o.endpoint);
  }

  /** The hello a real engine would send, signed with `keys` unless `auth` overrides it. */
  hello(over: Record<string, unknown> = {}): Record<string, unknown> {
    const { o } = this;
    const incarnation = typeof over.incarnation === 'string' ? over.incarnation : this.incarnation;
    return {
      protocol: PROTOCOL_VERSION,
      engine: o.engine,
      role: o.role,
      incarnation,
      pid: 1,
      pages: 8,
      pageBytes: 4096,
      pool: `/raw-${o.engine}`,
      epoch: 1,
      lastSeq: 0,
      rooms: [],
      ...(o.model ? { model: o.model } : {}),
      ...(o.keys && o.serverKey
        ? {
            auth: signHello({ engine: o.engine, role: o.role, incarnation }, o.keys, o.serverKey),
          }
        : {}),
      ...over,
    };
  }

  async sayHello(over: Record<string, unknown> = {}): Promise<void> {
    await this.socket.send(['hello', encode(this.hello(over))]);
  }

  /** Says hello naming another engine's KV pool as its own (its size, layout, name and epoch). */
  async sayHelloClaiming(
    other: Pick<EngineSession, 'pages' | 'pageBytes' | 'kv' | 'pool' | 'epoch'>,
  ): Promise<void> {
    const { pages, pageBytes, kv, pool, epoch } = other;
    await this.sayHello({ pages, pageBytes, kv, pool, epoch });
  }

  /** Says hello and waits for the welcome; remembers its session for `append`. */
  async join(over: Record<string, unknown> = {}): Promise<Reply> {
    await this.sayHello(over);
    const welcome = await this.next('welcome');
    this.session = (welcome as unknown as { payload: { session: number } }).payload.session;
    return welcome;
  }

  /** Sends a frame as it is (oversized, malformed, …). */
  async sendRaw(frames: Array<Buffer | string>): Promise<void> {
    await this.socket.send(frames);
  }

  async append(eventId: string, type: string, room: string, data: unknown = {}): Promise<void> {
    await this.socket.send([
      'append',
      encode({ eventId, session: this.session, n: ++this.n, event: { type, room, data } }),
    ]);
  }

  /** A heartbeat as an idle engine sends one (every 250 ms keeps it live); its loops tick. */
  async heartbeat(freePages = 0): Promise<void> {
    const n = ++this.beats;
    await this.socket.send([
      'heartbeat',
      encode({
        ticks: { bus: n, work: n, transfer: n },
        queues: {},
        freePages,
        rooms: 0,
        lastSeq: 0,
        state: 'ready',
      }),
    ]);
  }

  /** A chunk of tokens for `room`, as a decode engine streams them. */
  async tokens(room: string, index: number, text: string): Promise<void> {
    await this.socket.send(['tokens', encode({ room, index, text, tokens: 1 })]);
  }

  /** The next reply (of `kind`, skipping others), or throws after `timeoutMs`. */
  async next(kind?: string, timeoutMs = 5000): Promise<Reply> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const i = this.inbox.findIndex((r) => kind === undefined || (r.ok && r.kind === kind));
      if (i >= 0) return this.inbox.splice(i, 1)[0] as Reply;
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ${kind ?? 'reply'} within ${timeoutMs} ms`);
      this.socket.receiveTimeout = left;
      try {
        this.inbox.push(...this.decoder.decodeAll(await this.socket.receive()));
      } catch {
        throw new Error(`no ${kind ?? 'reply'} within ${timeoutMs} ms`);
      }
    }
  }

  close(): void {
    this.socket.close();
  }
}
