/**
 * Ordered sending on one ZeroMQ socket. zeromq.js allows one pending `send` per socket; this
 * queues the rest, so that callers never await a send, and messages to a peer leave in the order
 * they were queued (the control plane relies on it: an event is queued before the ack that
 * follows it). What is queued in one event-loop turn for the same peer leaves as one `batch`
 * frame: under load that is one send instead of dozens, which is most of the bus's CPU.
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
}

/** Most items and bytes in one batch (well under the receiver's frame limit). */
const MAX_BATCH_ITEMS = 1024;
const MAX_BATCH_BYTES = 256 * 1024;

export class Outbox {
  private queue: Queued[] = [];
  private sending = false;
  private scheduled = false;
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

  push(peer: Buffer | null, kind: string, payload: Buffer): void {
    if (this.queue.length >= this.limit) {
      this.queue.shift();
      this.failed++;
    }
    this.queue.push({ peer, kind, payload });
    if (!this.sending && !this.scheduled) {
      this.scheduled = true;
      this.clock.defer(() => {
        this.scheduled = false;
        void this.pump();
      });
    }
  }

  /** The queue as frames: per peer in order, runs of messages packed into batches. */
  private frames(queue: Queued[]): Array<Array<Buffer | string>> {
    const byPeer = new Map<string, Queued[]>();
    for (const q of queue) {
      const key = q.peer === null ? '' : q.peer.toString('latin1');
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
        const queued = this.queue;
        this.queue = [];
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
