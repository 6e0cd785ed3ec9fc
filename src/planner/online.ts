/**
 * The planner in a serving control plane (`pdctl serve --planner advise`): it folds every
 * committed event into the interval's record as the journal commits it, and each interval decides
 * (model.ts) and journals the decision as `planner.decision` — so `pdctl plan`, `/v1/planner`,
 * `pdctl_planner_desired_engines` and a replay of the journal all read the same record.
 */
import type { Logger } from '../log.ts';
import type { Clock, Timer } from '../ports/clock.ts';
import type { EventInput, JournalEvent } from '../room/events.ts';
import {
  type Decision,
  decide,
  freshMemory,
  moves,
  PLANNER_DEFAULTS,
  type PlannerConfig,
  type Step,
} from './model.ts';
import { type Fleet, type QueuedRequest, WindowRecord } from './record.ts';

/**
 * `off`: no planner; `advise`: decides and journals, acts on nothing; `act`: and carries out each
 * step it proposes, where pdctl supervises the engines (`PlannerActions`).
 */
export const PLANNER_MODES = ['off', 'advise', 'act'] as const;
export type PlannerMode = (typeof PLANNER_MODES)[number];

/** What carries out a step (app/fleet-actions.ts): resolves once the fleet has changed, or could not. */
export interface PlannerActions {
  step(step: Step): Promise<void>;
}

export interface PlannerOptions extends Partial<PlannerConfig> {
  mode: PlannerMode;
  /** Default 60 000. */
  intervalMs?: number;
}

export const DEFAULT_PLANNER_INTERVAL_MS = 60_000;

/** What `/v1/planner` shows of the planner besides the decisions journaled. */
export interface PlannerStatus {
  mode: PlannerMode;
  intervalMs: number;
  config: PlannerConfig;
  /** The last decision, null before the first interval ends. */
  last: Decision | null;
}

/** What the planner needs of the journal; the composition root hands it the store. */
export interface PlannerJournal {
  /** Every event committed after `afterSeq`, in seq order, then live. */
  subscribe(afterSeq: number, listener: (ev: JournalEvent) => void): { close(): void };
  append(event: EventInput): Promise<unknown>;
  headSeq(): Promise<number>;
}

export class Planner {
  readonly config: PlannerConfig;
  readonly intervalMs: number;
  private record: WindowRecord | null = null;
  private readonly memory = freshMemory();
  private subscription: { close(): void } | null = null;
  private timer: Timer | null = null;
  private last: Decision | null = null;
  private ticking: Promise<void> | null = null;
  /** The step being carried out (act): no other starts until it is done. */
  private acting: Promise<void> | null = null;
  /** The requests waiting in flow control's queue (`readQueue`); none until one is given. */
  private queued: () => readonly QueuedRequest[] = () => [];

  constructor(
    private readonly journal: PlannerJournal,
    /** The engines of each role the control plane has now. */
    private readonly fleet: () => Fleet,
    readonly mode: PlannerMode,
    options: Omit<PlannerOptions, 'mode'> & { budget: number },
    private readonly clock: Clock,
    private readonly log: Logger,
    /** Needed for `act`. */
    private readonly actions: PlannerActions | null = null,
  ) {
    if (mode === 'act' && actions === null)
      throw new RangeError('the planner acts only where pdctl supervises the engines');
    const { intervalMs = DEFAULT_PLANNER_INTERVAL_MS, ...config } = options;
    this.config = { ...PLANNER_DEFAULTS, ...config };
    this.intervalMs = intervalMs;
  }

  /** Reads the requests waiting in flow control's queue at each interval's end (the API's). */
  readQueue(queued: () => readonly QueuedRequest[]): void {
    this.queued = queued;
  }

  /** Folds what the journal commits from now on; decides every interval. */
  async start(): Promise<void> {
    if (this.mode === 'off' || this.record) return;
    this.record = new WindowRecord(this.clock.now());
    const record = this.record;
    this.subscription = this.journal.subscribe(await this.journal.headSeq(), (ev) =>
      record.fold(ev),
    );
    this.timer = this.clock.setInterval(() => void this.tick(), this.intervalMs).unref();
  }

  /** Closes the interval, decides and journals the decision; resolves once it is committed. */
  tick(): Promise<void> {
    const record = this.record;
    if (!record || this.ticking) return this.ticking ?? Promise.resolve();
    const fleet = this.fleet();
    const summary = record.close(this.clock.now(), this.queued());
    const decision = decide(summary, fleet, this.config, this.memory);
    const step = moves(decision) ? (decision.reason as Step) : null;
    if (step && this.mode === 'act' && this.actions && !this.acting) {
      decision.acted = true;
      this.acting = this.actions
        .step(step)
        .catch((err) => this.log.error({ err, step }, `the planner could not carry out ${step}`))
        .finally(() => {
          this.acting = null;
        });
    }
    this.last = decision;
    this.ticking = this.journal
      .append({ type: 'planner.decision', source: 'planner', data: eventData(this.mode, decision) })
      .then(
        () => undefined,
        (err) =>
          this.log.warn({ err, reason: decision.reason }, 'could not journal a planner decision'),
      )
      .finally(() => {
        this.ticking = null;
      });
    if (step)
      this.log.info(
        { reason: decision.reason, fleet, proposal: decision.proposal, target: decision.target },
        `planner proposes ${decision.proposal.prefill} prefill and ${decision.proposal.decode} decode engines (${decision.reason}); ${
          decision.acted
            ? 'carrying it out'
            : this.mode === 'act'
              ? 'a step is still being carried out'
              : 'advise only: nothing is changed'
        }`,
      );
    return this.ticking;
  }

  status(): PlannerStatus {
    return { mode: this.mode, intervalMs: this.intervalMs, config: this.config, last: this.last };
  }

  /** Stops deciding; a decision being journaled finishes (a step being carried out is the actions' to stop). */
  async stop(): Promise<void> {
    this.clock.clear(this.timer);
    this.timer = null;
    this.subscription?.close();
    this.subscription = null;
    await this.ticking;
  }
}

/** The decision as `planner.decision` records it (the summary's window is the decision's). */
export function eventData(mode: PlannerMode, d: Decision) {
  const { window: _, inputs, ...rest } = d;
  return { mode, ...rest, inputs };
}
