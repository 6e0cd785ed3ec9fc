/**
 * Ordered sending on one ZeroMQ socket. zeromq.js allows one pending `send` per socket; this
 * queues the rest, so that callers never await a send and messages leave in the order queued
 * (the control plane relies on it: an event is queued before the ack that follows it).
 */
import type { Logger } from '../log.ts';

type Sendable = { send(msg: Array<Buffer | string>): Promise<void>; closed: boolean };

export class Outbox {
  private queue: Array<Array<Buffer | string>> = [];
  private sending = false;
  sent = 0;
  failed = 0;

  constructor(
    private readonly socket: Sendable,
    private readonly log: Logger,
    private readonly where: string,
    /** Messages kept when the peer is slow; beyond this the oldest are dropped (counted). */
    private readonly limit = 1_000_000,
  ) {}

  get depth(): number {
    return this.queue.length;
  }

  push(msg: Array<Buffer | string>): void {
    if (this.queue.length >= this.limit) {
      this.queue.shift();
      this.failed++;
    }
    this.queue.push(msg);
    if (!this.sending) void this.pump();
  }

  private async pump(): Promise<void> {
    this.sending = true;
    try {
      while (this.queue.length > 0 && !this.socket.closed) {
        const batch = this.queue;
        this.queue = [];
        for (let i = 0; i < batch.length; i++) {
          try {
            await this.socket.send(batch[i] as Array<Buffer | string>);
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
