/**
 * Graceful shutdown of the serving API. On SIGTERM the listener stays open: requests in flight
 * go on, new completions get 503 `shutting_down` with Retry-After (a load balancer sends them
 * elsewhere), and `/health/ready` says why it is not ready. At the drain deadline the rooms still
 * running are aborted with reason `shutdown`: each stream ends with a last error event that says
 * so, and the journal blames the shutdown, not the client. Only then does the listener close.
 */
import { IdleWaiters } from '../idle.ts';
import type { RoomAbortReason } from '../room/reasons.ts';
/** The abort reason of a room cut at the shutdown's drain deadline. */
export const SHUTDOWN_REASON: RoomAbortReason = 'shutdown';

export class ShutdownGate {
  /** Since when (unix ms) the API has been shutting down; null while it serves. */
  closingSince: number | null = null;
  /** Completions being served: the room each is in now (a migration moves it). */
  private readonly inflight = new Set<() => string>();
  private readonly idleWaiters = new IdleWaiters();
  /** Called once when it starts closing (flow control refuses what still waits its turn). */
  private readonly closers: Array<() => void> = [];

  get closing(): boolean {
    return this.closingSince !== null;
  }

  /** A completion started: call the returned function when its answer is done. */
  enter(room: () => string): () => void {
    this.inflight.add(room);
    return () => {
      this.inflight.delete(room);
      if (this.inflight.size === 0) this.idleWaiters.fire();
    };
  }

  /** The rooms of the completions in flight now. */
  rooms(): string[] {
    return [...this.inflight].map((room) => room());
  }

  get size(): number {
    return this.inflight.size;
  }

  /** Refuse new completions from now on. */
  close(now = Date.now()): void {
    if (this.closingSince !== null) return;
    this.closingSince = now;
    for (const f of this.closers.splice(0)) f();
  }

  /** Runs `f` when it starts closing (at once if it has). */
  onClose(f: () => void): void {
    if (this.closingSince !== null) f();
    else this.closers.push(f);
  }

  /** Resolves true once nothing is in flight, false when `ms` passed first. */
  idle(ms: number): Promise<boolean> {
    if (this.inflight.size === 0) return Promise.resolve(true);
    return this.idleWaiters.wait(ms);
  }
}
