/**
 * Refusals on the record. A request refused before a room existed (429 or 503: no engines, every
 * engine draining, overload, the journal refusing writes, shutting down) leaves no room, so
 * without this the journal could not say why requests failed. Refusals are gathered per reason
 * into `request.refused` events of at most 20 request ids each, with their count, their first and
 * last time and the first message: a batch is written once it is full, or a second after its first
 * refusal — a flood of refusals is one event per 20, and every refused id leads to its refusal.
 * While the journal refuses writes the batches wait, in order, and are written when it is back; past
 * `maxWaitingIds` waiting ids, refusals are only counted (the event's `count` then exceeds its ids,
 * and the lookup of such an id says its id was not kept). The same log, made for
 * `request.waited`, gathers the waits of requests flow control took after they waited.
 */

import type { Logger } from '../log.ts';
import type { EventInput } from '../room/events.ts';

/** Request ids per event: the journal's schema of `request.refused` holds at most this many. */
export const REFUSAL_IDS_PER_EVENT = 20;

interface Batch {
  reason: string;
  /** The tenant whose requests these were; null on an open API. */
  tenant: string | null;
  status: number;
  count: number;
  requestIds: string[];
  message: string;
  firstAt: number;
  lastAt: number;
  /** `request.waited`: their waits summed, and the longest. */
  waitedMs: number;
  maxWaitedMs: number;
}

export class RefusalLog {
  /** Each reason's batch being filled. */
  private readonly open = new Map<string, Batch>();
  /** Full batches, and batches the journal refused, to write in order. */
  private readonly full: Batch[] = [];
  private waitingIds = 0;
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
  private seq = 0;
  /** Closed: what the last flush could not write is not tried again. */
  private closed = false;
  /** The last flush had a batch refused (the journal refuses writes): the next waits a while. */
  private failed = false;

  constructor(
    private readonly append: (ev: EventInput) => Promise<unknown>,
    private readonly log: Logger,
    private readonly everyMs = 1000,
    /** Ids kept while waiting for the journal; past it refusals are counted without their ids. */
    private readonly maxWaitingIds = 100_000,
    /** What it gathers: refusals, or (the same way) the waits of requests taken after waiting. */
    private readonly type: 'request.refused' | 'request.waited' = 'request.refused',
  ) {}

  /** One request was taken after waiting `waitedMs` for `reason` (a `request.waited` log). */
  waited(
    reason: string,
    requestId: string,
    waitedMs: number,
    now = Date.now(),
    tenant: string | null = null,
  ): void {
    const b = this.note(reason, 0, requestId, '', now, tenant);
    b.waitedMs += waitedMs;
    b.maxWaitedMs = Math.max(b.maxWaitedMs, waitedMs);
  }

  /** One request was refused with `reason` (its API error code), of `tenant` when it had one. */
  note(
    reason: string,
    status: number,
    requestId: string,
    message: string,
    now = Date.now(),
    tenant: string | null = null,
  ): Batch {
    const key = tenant === null ? reason : `${reason}\u0000${tenant}`;
    let b = this.open.get(key);
    if (b && b.requestIds.length >= REFUSAL_IDS_PER_EVENT && this.waitingIds < this.maxWaitingIds) {
      this.full.push(b);
      b = undefined;
    }
    if (!b) {
      b = {
        reason,
        tenant,
        status,
        count: 0,
        requestIds: [],
        message: message.slice(0, 500),
        firstAt: now,
        lastAt: now,
        waitedMs: 0,
        maxWaitedMs: 0,
      };
      this.open.set(key, b);
    }
    b.count++;
    b.lastAt = now;
    if (b.requestIds.length < REFUSAL_IDS_PER_EVENT && this.waitingIds < this.maxWaitingIds) {
      b.requestIds.push(requestId);
      this.waitingIds++;
    }
    // A full batch goes now; the rest within a second of their first refusal.
    if (this.full.length > 0 && !this.flushing && !this.failed) void this.write(false);
    this.later();
    return b;
  }

  private later(): void {
    if (this.timer || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.flush();
    }, this.everyMs);
    this.timer.unref();
  }

  /** Writes what was gathered (each batch as one event); what the journal refuses waits. */
  flush(): Promise<void> {
    return this.write(true);
  }

  /** Writes the full batches, and with `all` those still filling; one write at a time. */
  private write(all: boolean): Promise<void> {
    this.flushing ??= (async () => {
      const batch = [...this.full.splice(0), ...(all ? this.open.values() : [])];
      if (all) this.open.clear();
      const refused: Batch[] = [];
      let error: string | null = null;
      await Promise.all(
        batch.map(async (b) => {
          const { reason, tenant, waitedMs, maxWaitedMs, status, message, ...data } = b;
          const of =
            this.type === 'request.refused' ? { status, message } : { waitedMs, maxWaitedMs };
          try {
            await this.append({
              type: this.type,
              source: 'api',
              eventId: `${this.type === 'request.refused' ? 'refused' : 'waited'}:${reason}:${b.firstAt}:${++this.seq}`,
              data: { reason, ...(tenant === null ? {} : { tenant }), ...of, ...data },
            } as EventInput);
            this.waitingIds -= b.requestIds.length;
          } catch (err) {
            refused.push(b);
            error = (err as Error).message;
          }
        }),
      );
      this.failed = error !== null;
      if (error !== null)
        // One line, no stack: while the journal refuses writes this repeats every second.
        this.log.warn(
          { count: refused.reduce((n, b) => n + b.count, 0), waitingIds: this.waitingIds, error },
          `could not journal ${this.type === 'request.refused' ? 'refusals' : 'waits'}; kept for later`,
        );
      // Refused batches go first next time, before those gathered since.
      this.full.unshift(...refused.sort((a, b) => a.firstAt - b.firstAt));
    })().finally(() => {
      this.flushing = null;
      if (this.closed) return;
      // Batches that filled meanwhile go at once, unless the journal just refused writes.
      if (this.full.length > 0 && !this.failed) void this.write(false);
      if (this.full.length > 0 || this.open.size > 0) this.later();
    });
    return this.flushing;
  }

  /** Stops the timer and writes what is left (shutdown). */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.flushing;
    // Tried until all is written; what the journal refuses at shutdown is not tried again.
    let failed = false;
    while ((this.full.length > 0 || this.open.size > 0) && !failed) {
      await this.flush();
      failed = this.failed;
    }
  }
}
