/**
 * Delivery of committed events to in-process listeners, in seq order: catch-up from the journal,
 * then live, with no gap and no duplicate. Backend-neutral: it needs only a reader of committed
 * events (synchronous for SQLite, a query for PostgreSQL) and the stream of live commits.
 */
import { type Clock, systemClock } from '../ports/clock.ts';
import type { JournalEvent } from '../room/events.ts';
import type { EventListener, Subscription } from './store.ts';

const CHUNK = 1000;
/** Live events held while a subscriber catches up; past this they are dropped and read again. */
const HELD_MAX = 10_000;

interface Subscriber {
  lastSeq: number;
  listener: EventListener;
  live: boolean;
  closed: boolean;
  /**
   * Live commits published while the subscriber catches up. A read may take its snapshot before
   * a commit and finish after that commit was published; what was published meanwhile is here.
   */
  held: JournalEvent[];
  /** `held` overflowed since the last read began: read once more before going live. */
  overflowed: boolean;
}

export class SubscriptionHub {
  private readonly subs = new Set<Subscriber>();

  constructor(
    /** Committed events with seq > afterSeq, oldest first. */
    private readonly readFrom: (
      afterSeq: number,
      limit: number,
    ) => JournalEvent[] | Promise<JournalEvent[]>,
    private readonly onListenerError: (err: unknown, event: JournalEvent) => void,
    private readonly clock: Clock = systemClock,
  ) {}

  get size(): number {
    return this.subs.size;
  }

  subscribe(afterSeq: number, listener: EventListener): Subscription {
    const sub: Subscriber = {
      lastSeq: afterSeq,
      listener,
      live: false,
      closed: false,
      held: [],
      overflowed: false,
    };
    this.subs.add(sub);
    this.clock.defer(() => void this.catchUp(sub));
    return {
      close: () => {
        sub.closed = true;
        this.subs.delete(sub);
      },
    };
  }

  /**
   * Reads in chunks, yielding between them, while live commits are held. Each commit is committed
   * before it is published, so a later read sees it or it is held. The chunk that comes back short
   * has seen everything committed before it began; delivering what is held after it (skipping what
   * was read) leaves no gap, and from then on delivery is live.
   */
  private async catchUp(sub: Subscriber): Promise<void> {
    if (sub.closed) return;
    sub.overflowed = false;
    let chunk: JournalEvent[];
    try {
      chunk = await this.readFrom(sub.lastSeq, CHUNK);
    } catch (err) {
      this.onListenerError(err, { seq: sub.lastSeq } as JournalEvent);
      this.clock.setTimeout(() => void this.catchUp(sub), 100);
      return;
    }
    for (const ev of chunk) this.deliver(sub, ev);
    if (chunk.length === CHUNK || sub.overflowed) {
      this.clock.defer(() => void this.catchUp(sub));
      return;
    }
    const held = sub.held;
    sub.held = [];
    for (const ev of held) this.deliver(sub, ev);
    sub.live = true;
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
      if (sub.live) {
        for (const ev of events) this.deliver(sub, ev);
      } else if (!sub.overflowed) {
        if (sub.held.length + events.length > HELD_MAX) {
          sub.held = [];
          sub.overflowed = true;
        } else sub.held.push(...events);
      }
    }
  }

  closeAll(): void {
    for (const sub of this.subs) sub.closed = true;
    this.subs.clear();
  }
}
