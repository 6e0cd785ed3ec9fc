/**
 * An engine (or a peer that never registered) that ran over a bus quota is journaled once — one
 * `recovery.action` per engine per minute, however many of its messages were dropped — so that a
 * flood is on the record without the record growing with the flood (docs/security.md).
 */

import type { JournalLog } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import { type Clock, systemClock } from '../../ports/clock.ts';

/** At most one journaled throttle per engine (or per unregistered peer) in this window. */
export const THROTTLE_JOURNAL_EVERY_MS = 60_000;
/** Peers that never registered share one window: their routing ids are theirs to multiply. */
const UNREGISTERED_KEY = '(unregistered)';

export class ThrottleRecord {
  private readonly journaledAt = new Map<string, number>();

  constructor(
    private readonly journal: JournalLog,
    private readonly log: Logger,
    private readonly clock: Clock = systemClock,
  ) {}

  /** Records that `engine` (null: a peer that has not registered) was throttled, once a window. */
  note(engine: string | null, reason: string, outcome: string, now = this.clock.now()): void {
    const key = engine ?? UNREGISTERED_KEY;
    const last = this.journaledAt.get(key);
    if (last !== undefined && now - last < THROTTLE_JOURNAL_EVERY_MS) return;
    this.journaledAt.set(key, now);
    for (const [k, at] of this.journaledAt)
      if (now - at >= THROTTLE_JOURNAL_EVERY_MS && k !== key) this.journaledAt.delete(k);
    this.log.warn({ engine, reason }, `bus: throttled ${engine ?? 'an unregistered peer'}`);
    this.journal
      .append({
        type: 'recovery.action',
        engine,
        source: 'control',
        data: { action: 'throttle', reason, outcome },
      })
      .catch((err) => this.log.error({ err, engine }, 'could not journal a throttled peer'));
  }
}
