/**
 * Delivery of committed events to in-process listeners, in seq order: catch-up from the journal,
 * then live, with no gap and no duplicate. Backend-neutral: it needs only a synchronous reader of
 * committed events and the stream of live commits.
 */
import type { JournalEvent } from './events.ts';
import type { EventListener, Subscription } from './store.ts';

const CHUNK = 1000;

interface Subscriber {
  lastSeq: number;
  listener: EventListener;
  live: boolean;
  closed: boolean;
}

export class SubscriptionHub {
  private readonly subs = new Set<Subscriber>();

  constructor(
    /** Committed events with seq > afterSeq, oldest first. */
    private readonly readFrom: (afterSeq: number, limit: number) => JournalEvent[],
    private readonly onListenerError: (err: unknown, event: JournalEvent) => void,
  ) {}

  get size(): number {
    return this.subs.size;
  }

  subscribe(afterSeq: number, listener: EventListener): Subscription {
    const sub: Subscriber = { lastSeq: afterSeq, listener, live: false, closed: false };
    this.subs.add(sub);
    setImmediate(() => this.catchUp(sub));
    return {
      close: () => {
        sub.closed = true;
        this.subs.delete(sub);
      },
    };
  }

  /**
   * Reads in chunks, yielding between them. Live commits are ignored meanwhile: each is committed
   * before it is published, so a later chunk reads it. The chunk that comes back short has seen
   * every event published so far; from then on, live delivery skips what was already read.
   */
  private catchUp(sub: Subscriber): void {
    if (sub.closed) return;
    let chunk: JournalEvent[];
    try {
      chunk = this.readFrom(sub.lastSeq, CHUNK);
    } catch (err) {
      this.onListenerError(err, { seq: sub.lastSeq } as JournalEvent);
      setTimeout(() => this.catchUp(sub), 100);
      return;
    }
    for (const ev of chunk) this.deliver(sub, ev);
    if (chunk.length === CHUNK) setImmediate(() => this.catchUp(sub));
    else sub.live = true;
  }

  private deliver(sub: Subscriber, ev: JournalEvent): void {
    if (sub.closed || ev.seq <= sub.lastSeq) return;
    sub.lastSeq = ev.seq;
    try {
      sub.listener(ev);
    } catch (err) {
      this.onListenerError(err, ev);
    }
  }

  /** Live commits, in seq order. */
  publish(events: JournalEvent[]): void {
    for (const sub of this.subs) {
      if (!sub.live) continue;
      for (const ev of events) this.deliver(sub, ev);
    }
  }

  closeAll(): void {
    for (const sub of this.subs) sub.closed = true;
    this.subs.clear();
  }
}
