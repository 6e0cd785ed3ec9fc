/**
 * Ordered sending on one ZeroMQ socket. zeromq.js allows one pending `send` per socket; this
 * queues the rest, so that callers never await a send, and messages to a peer leave in the order
 * they were queued (the control plane relies on it: an event is queued before the ack that
 * follows it). What is queued in one event-loop turn for the same peer leaves as one `batch`
 * frame: under load that is one send instead of dozens, which is most of the bus's CPU.
 *
 * A message pushed `lazy` is one its peer acts on no sooner for having it now (an acknowledgement,
 * another engine's progress): it waits, up to LAZY_MS, for a message to the same peer that is not,
 * and leaves in that one's frame — every frame costs both ends a wake-up and system calls
 * (docs/critical-path.md, "What bounds a lone room"). Order per peer is kept either way.
 */
import type { Logger } from '../log.ts';
import { type Clock, systemClock } from '../ports/clock.ts';
import { BATCH_KIND, encodeBatch } from './protocol.ts';

type Sendable = { send(msg: Array<Buffer | string>): Promise<void>; closed: boolean };

interface Queued {
  /** Routing id on a ROUTER; null on a DEALER. */
  peer: Buffer | null;
  kind: string;
  payload: Buffer;
  lazy: boolean;
}

/** Longest a lazy message waits for company before it leaves on its own. */
export const LAZY_MS = 10;

/** Most items and bytes in one batch (well under the receiver's frame limit). */
const MAX_BATCH_ITEMS = 1024;
const MAX_BATCH_BYTES = 256 * 1024;

export class Outbox {
  private queue: Queued[] = [];
  private sending = false;
  private scheduled = false;
  /** Lazy messages queued; while there are any, a timer bounds their wait. */
  private lazyQueued = 0;
  private lazyTimer: ReturnType<Clock['setTimeout']> | null = null;
  private lazyDue = false;
  sent = 0;
  batches = 0;
  failed = 0;

  constructor(
    private readonly socket: Sendable,
    private readonly log: Logger,
    private readonly where: string,
    private readonly clock: Clock = systemClock,
    /** Messages kept when the peer is slow; beyond this the oldest are dropped (counted). */
    private readonly limit = 1_000_000,
  ) {}

  get depth(): number {
    return this.queue.length;
  }

  push(peer: Buffer | null, kind: string, payload: Buffer, lazy = false): void {
    if (this.queue.length >= this.limit) {
      if (this.queue.shift()?.lazy) this.lazyQueued--;
      this.failed++;
    }
    this.queue.push({ peer, kind, payload, lazy });
    if (lazy) {
      this.lazyQueued++;
      if (this.lazyTimer === null && !this.lazyDue) {
        this.lazyTimer = this.clock.setTimeout(() => {
          this.lazyTimer = null;
          this.lazyDue = true;
          this.schedule();
        }, LAZY_MS);
      }
      return;
    }
    this.schedule();
  }

  private schedule(): void {
    if (this.sending || this.scheduled) return;
    this.scheduled = true;
    this.clock.defer(() => {
      this.scheduled = false;
      void this.pump();
    });
  }

  /**
   * What may leave now, taken off the queue: everything once the lazy wait is over (or when
   * nothing is lazy), else every message of each peer that has one that is not lazy.
   */
  private takeReady(): Queued[] {
    if (this.lazyQueued === 0 || this.lazyDue) {
      const all = this.queue;
      this.queue = [];
      this.settleLazy(0);
      return all;
    }
    const urgent = new Set<string>();
    for (const q of this.queue) if (!q.lazy) urgent.add(peerKey(q));
    const ready: Queued[] = [];
    const held: Queued[] = [];
    for (const q of this.queue) (urgent.has(peerKey(q)) ? ready : held).push(q);
    this.queue = held;
    this.settleLazy(held.length);
    return ready;
  }

  /** `held` lazy messages stay queued: with none, the wait and its timer end. */
  private settleLazy(held: number): void {
    this.lazyQueued = held;
    if (held > 0) return;
    this.lazyDue = false;
    this.clock.clear(this.lazyTimer);
    this.lazyTimer = null;
  }

  /** The queue as frames: per peer in order, runs of messages packed into batches. */
  private frames(queue: Queued[]): Array<Array<Buffer | string>> {
    const byPeer = new Map<string, Queued[]>();
    for (const q of queue) {
      const key = peerKey(q);
      const list = byPeer.get(key);
      if (list) list.push(q);
      else byPeer.set(key, [q]);
    }
    const out: Array<Array<Buffer | string>> = [];
    for (const list of byPeer.values()) {
      const peer = (list[0] as Queued).peer;
      const head = peer === null ? [] : [peer];
      for (let i = 0; i < list.length; ) {
        let bytes = 0;
        let j = i;
        while (
          j < list.length &&
          j - i < MAX_BATCH_ITEMS &&
          (j === i || bytes + (list[j] as Queued).payload.length <= MAX_BATCH_BYTES)
        ) {
          bytes += (list[j] as Queued).payload.length;
          j++;
        }
        if (j - i === 1) {
          const q = list[i] as Queued;
          out.push([...head, q.kind, q.payload]);
        } else {
          out.push([
            ...head,
            BATCH_KIND,
            encodeBatch(list.slice(i, j).map((q) => [q.kind, q.payload] as const)),
          ]);
          this.batches++;
        }
        i = j;
      }
    }
    return out;
  }

  private async pump(): Promise<void> {
    this.sending = true;
    try {
      while (this.queue.length > 0 && !this.socket.closed) {
        const queued = this.takeReady();
        if (queued.length === 0) break;
        for (const frames of this.frames(queued)) {
          try {
            await this.socket.send(frames);
            this.sent++;
          } catch (err) {
            // EHOSTUNREACH (a peer that left, with ROUTER mandatory) or a closing socket: the
            // message is lost to that peer, which replays from the journal when it returns.
            this.failed++;
            const code = (err as { code?: string }).code;
            if (code !== 'EHOSTUNREACH' && !this.socket.closed) {
              this.log.warn({ err, where: this.where }, `${this.where}: send failed`);
            }
          }
        }
      }
    } finally {
      this.sending = false;
    }
  }
}

function peerKey(q: Queued): string {
  return q.peer === null ? '' : q.peer.toString('latin1');
}
