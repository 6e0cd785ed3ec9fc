/**
 * What the control plane does while the journal refuses writes (a full disk, a failing commit):
 * every room in flight stops at its next transition, so its client would wait for the state's
 * deadline. Once the outage has lasted the grace period, each such client is answered now; when
 * writes return, those rooms are failed in the journal (`journal_unavailable`) so their engines
 * free them (docs/incident.md, rule 2).
 */
import type { Room } from '../journal/reducer.ts';
import { isTerminal } from '../journal/states.ts';
import type { JournalStore } from '../journal/store.ts';

export interface OutageDeps {
  journal: Pick<JournalStore, 'append' | 'health'>;
  /** Rooms whose clients are reading now. */
  streaming: () => Iterable<string>;
  /** Answers the room's client with `reason`; false when nobody reads it. */
  endStream: (room: string, reason: string) => boolean;
  /** The room as the control plane has folded it now. */
  roomNow: (room: string) => Room | undefined;
  /** How long the journal may refuse writes before clients are answered. */
  graceMs: number;
}

export class JournalOutage {
  /** Since when the journal refuses writes (0: it takes them). */
  private since = 0;
  /** Rooms whose clients were answered during an outage: failed in the journal once it can. */
  private readonly unrecorded = new Set<string>();
  private failing = false;

  constructor(private readonly deps: OutageDeps) {}

  /** One look at the journal; the control plane calls it every 250 ms. */
  tick(now = Date.now()): void {
    const health = this.deps.journal.health();
    if (!health.writable) {
      if (this.since === 0) this.since = now;
      if (now - this.since >= this.deps.graceMs) {
        const reason = `the journal has refused writes for ${now - this.since} ms (${health.lastError ?? 'commit failed'}); this request cannot be completed, and its room will be failed in the journal once it can be written`;
        for (const room of [...this.deps.streaming()])
          if (this.deps.endStream(room, reason)) this.unrecorded.add(room);
      }
    } else {
      this.since = 0;
    }
    // Tried on every tick until it commits: the attempt is also what finds the disk has room
    // again (nothing else may be committing).
    if (this.unrecorded.size > 0 && !this.failing) void this.failUnrecorded();
  }

  /** Fails in the journal the rooms whose clients were answered during an outage. */
  private async failUnrecorded(): Promise<void> {
    this.failing = true;
    try {
      await Promise.all(
        [...this.unrecorded].map(async (room) => {
          const r = this.deps.roomNow(room);
          if (!r || isTerminal(r.state)) {
            this.unrecorded.delete(room);
            return;
          }
          try {
            await this.deps.journal.append({
              type: 'room.failed',
              room,
              source: 'control',
              eventId: `${room}:journal-outage`,
              data: { reason: 'journal_unavailable', stage: r.state, detectedBy: 'control' },
            });
            this.unrecorded.delete(room);
          } catch {
            // Still refused: the next tick tries again.
          }
        }),
      );
    } finally {
      this.failing = false;
    }
  }
}
