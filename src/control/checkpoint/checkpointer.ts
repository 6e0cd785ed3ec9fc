/**
 * State checkpoints: the start state (state.ts) written to the journal every so many events and
 * minutes, and when the control plane stops, so the next start — after a crash or a failover —
 * reads it and folds only the events after it, instead of the whole journal.
 */

import type { JournalLog } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import type { Clock } from '../../ports/clock.ts';
import type { JournalEvent } from '../../room/events.ts';
import type { PrefixIndex } from '../routing/prefix-index.ts';
import { encodeCheckpoint } from './codec.ts';
import type { Restored } from './replay.ts';
import type { StartState } from './state.ts';

/** How often a checkpoint is written (control/options.ts has the defaults). */
export interface CheckpointPolicy {
  checkpointEveryEvents: number;
  checkpointEveryMs: number;
}

/** What the checkpointer writes with. */
export interface CheckpointDeps {
  journal: Pick<JournalLog, 'setCheckpoint'>;
  log: Logger;
  clock: Clock;
  policy: CheckpointPolicy;
  /** Its prefix index is folded through the same events as the state. */
  router: { readonly index: PrefixIndex };
}

/** Writes the state as it folds: one write at a time; a failed write is logged and retried later. */
export class Checkpointer {
  private readonly state: StartState;
  private writtenSeq: number;
  private writing: Promise<void> | null = null;
  private lastError: string | null = null;
  private lastWriteAt: number;

  constructor(
    private readonly deps: CheckpointDeps,
    restored: Restored,
  ) {
    this.state = restored.state;
    this.writtenSeq = restored.from?.seq ?? 0;
    // Started without a checkpoint (after a whole-journal fold): one is due at once.
    this.lastWriteAt = restored.from ? deps.clock.now() : Number.NEGATIVE_INFINITY;
  }

  /** A committed event, after the router folded it. */
  folded(ev: JournalEvent): void {
    this.state.fold(ev);
    this.tick();
  }

  /**
   * Writes when due: so many events since the last checkpoint (at most one write a second,
   * failing ones too), or so long since it if anything changed. Also the timer's turn.
   */
  tick(): void {
    const since = this.deps.clock.now() - this.lastWriteAt;
    const behind = this.state.seq - this.writtenSeq;
    if (
      (behind >= this.deps.policy.checkpointEveryEvents && since >= 1000) ||
      since >= this.deps.policy.checkpointEveryMs
    )
      void this.write();
  }

  /** Writes the state now, unless a write is under way or nothing changed since the last. */
  write(): Promise<void> {
    if (this.writing) return this.writing;
    if (this.state.seq === this.writtenSeq) return Promise.resolve();
    const row = encodeCheckpoint(this.state, this.deps.router.index);
    this.lastWriteAt = this.deps.clock.now();
    this.writing = this.deps.journal
      .setCheckpoint(row)
      .then(
        () => {
          this.writtenSeq = row.seq;
          this.lastError = null;
        },
        (err: Error) => {
          if (err.message !== this.lastError)
            this.deps.log.warn(
              { seq: row.seq, err: err.message },
              'state checkpoint not written; the next start folds more of the journal until one is',
            );
          this.lastError = err.message;
        },
      )
      .finally(() => {
        this.writing = null;
      });
    return this.writing;
  }

  /** The seq of the last checkpoint written (or restored from). */
  get seq(): number {
    return this.writtenSeq;
  }
}
