/**
 * A supervised loop: the body runs until the owner stops it; if it ever returns or throws while
 * it should be running, it is started again after a short backoff, and the restart is counted.
 * Its tick counter (bumped by the body once per message or pass) is what heartbeats report, so a
 * loop that is alive but stuck shows as a counter that stopped moving (docs/incident.md).
 */
import type { Logger } from '../log.ts';
import { type Clock, systemClock } from '../ports/clock.ts';

export interface LoopStats {
  ticks: number;
  restarts: number;
  running: boolean;
}

export class SupervisedLoop {
  ticks = 0;
  restarts = 0;
  private stopped = false;
  private running = false;
  private done: Promise<void> | null = null;

  constructor(
    readonly name: string,
    private readonly body: (loop: SupervisedLoop) => Promise<void>,
    private readonly log: Logger,
    private readonly backoffMs = 100,
    private readonly clock: Clock = systemClock,
  ) {}

  start(): void {
    if (this.done) return;
    this.done = this.supervise();
  }

  tick(): void {
    this.ticks++;
  }

  get shouldRun(): boolean {
    return !this.stopped;
  }

  private async supervise(): Promise<void> {
    while (!this.stopped) {
      this.running = true;
      try {
        await this.body(this);
        if (this.stopped) break;
        this.log.error(
          { loop: this.name },
          `loop ${this.name} returned while it should run; restarting it`,
        );
      } catch (err) {
        if (this.stopped) break;
        this.log.error({ loop: this.name, err }, `loop ${this.name} died; restarting it`);
      }
      this.running = false;
      this.restarts++;
      await new Promise<void>((r) => this.clock.setTimeout(r, this.backoffMs));
    }
    this.running = false;
  }

  /** Stops restarting; the body must notice `shouldRun` or its socket closing. */
  stop(): Promise<void> {
    this.stopped = true;
    return this.done ?? Promise.resolve();
  }

  stats(): LoopStats {
    return { ticks: this.ticks, restarts: this.restarts, running: this.running };
  }
}
