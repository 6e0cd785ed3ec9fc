/**
 * Refusals on the record. A request refused before a room existed (429 or 503: no engines, every
 * engine draining, overload, the journal refusing writes, shutting down) leaves no room, so
 * without this the journal could not say why requests failed. Refusals are gathered per reason
 * and written at most once a second per reason as one `request.refused` event with their count,
 * the first request ids and the first message — a flood of refusals is a handful of events. While
 * the journal refuses writes the gathered ones wait (counted on) and are written when it is back.
 */
import type { EventInput } from '../journal/events.ts';
import type { Logger } from '../log.ts';

/** Request ids kept per event: enough to find a client's request, few enough to stay small. */
const MAX_IDS = 20;

interface Pending {
  status: number;
  count: number;
  requestIds: string[];
  message: string;
  firstAt: number;
  lastAt: number;
}

export class RefusalLog {
  private readonly pending = new Map<string, Pending>();
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
  private seq = 0;
  /** Closed: what the last flush could not write is not tried again. */
  private closed = false;

  constructor(
    private readonly append: (ev: EventInput) => Promise<unknown>,
    private readonly log: Logger,
    private readonly everyMs = 1000,
  ) {}

  /** One request was refused with `reason` (its API error code). */
  note(reason: string, status: number, requestId: string, message: string, now = Date.now()): void {
    const p = this.pending.get(reason);
    if (p) {
      p.count++;
      p.lastAt = now;
      if (p.requestIds.length < MAX_IDS) p.requestIds.push(requestId);
    } else
      this.pending.set(reason, {
        status,
        count: 1,
        requestIds: [requestId],
        message: message.slice(0, 500),
        firstAt: now,
        lastAt: now,
      });
    this.timer ??= setTimeout(() => {
      this.timer = null;
      void this.flush();
    }, this.everyMs);
    this.timer.unref();
  }

  /** Writes what was gathered (each reason as one event); what the journal refuses waits. */
  flush(): Promise<void> {
    this.flushing ??= (async () => {
      const batch = [...this.pending];
      this.pending.clear();
      await Promise.all(
        batch.map(async ([reason, p]) => {
          try {
            await this.append({
              type: 'request.refused',
              source: 'api',
              eventId: `refused:${reason}:${p.firstAt}:${++this.seq}`,
              data: { reason, ...p },
            });
          } catch (err) {
            this.keep(reason, p);
            // One line, no stack: while the journal refuses writes this repeats every second.
            this.log.warn(
              { reason, count: p.count, error: (err as Error).message },
              'could not journal refusals; kept for later',
            );
          }
        }),
      );
    })().finally(() => {
      this.flushing = null;
      if (this.pending.size > 0 && !this.timer && !this.closed) {
        this.timer = setTimeout(() => {
          this.timer = null;
          void this.flush();
        }, this.everyMs);
        this.timer.unref();
      }
    });
    return this.flushing;
  }

  /** Stops the timer and writes what is left (shutdown). */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    await this.flushing;
    if (this.pending.size > 0) await this.flush();
  }

  /** Puts refusals the journal refused back with those gathered since. */
  private keep(reason: string, p: Pending): void {
    const now = this.pending.get(reason);
    if (!now) {
      this.pending.set(reason, p);
      return;
    }
    now.count += p.count;
    now.firstAt = p.firstAt;
    now.message = p.message;
    now.requestIds = [...p.requestIds, ...now.requestIds].slice(0, MAX_IDS);
  }
}
