/**
 * The canary: a two-token room through bootstrap, prefill, transfer and decode, with a deadline —
 * two, since the prefill engine draws the first token (protocol 9): the second is the decode
 * engine's, which loads the KV, verifies it and takes a step for it.
 * It answers "would a request be served right now, and where does it stop if not" — what
 * `/health/deep` returns, and what `/health/ready` requires of its last background run. Its verdict
 * is journaled (`canary.changed`) only when it changes.
 */

import type { Logger } from '../../log.ts';
import type { Clock, Timer } from '../../ports/clock.ts';
import { isFailureReason, type RoomFailureReason } from '../../room/reasons.ts';
import type { RoomState } from '../../room/states.ts';
import type { ControlPlane } from '../control-plane.ts';
import { ControlError } from '../errors.ts';
import { RoomEndedError } from '../intake/streams.ts';

/** The four stages a caller cares about, as spans of room states. */
export const STAGE_OF: Partial<Record<RoomState, 'bootstrap' | 'prefill' | 'transfer' | 'decode'>> =
  {
    created: 'bootstrap',
    bootstrapping: 'bootstrap',
    waiting_for_input: 'prefill',
    prefilling: 'prefill',
    transferring: 'transfer',
    transferred: 'decode',
    decoding: 'decode',
  };

export interface CanaryResult {
  ok: boolean;
  room: string | null;
  ms: number;
  /** Milliseconds per stage that finished. */
  stages: Partial<Record<'bootstrap' | 'prefill' | 'transfer' | 'decode', number>>;
  /** Where it stopped, and why, when not ok. */
  stage: string | null;
  reason: string | null;
  /** The room's failure reason (journal/reasons.ts), when the room failed. */
  failure: RoomFailureReason | null;
  at: number;
}

/** One canary's verdict, the pair its room ran on, and an operator's hint when it was refused. */
interface Run {
  result: CanaryResult;
  pair: { prefillEngine: string; decodeEngine: string } | null;
  /** The refusal's `operatorHint`: what an operator did (a drain, a cordon) and what undoes it. */
  hint?: string;
}

export class Canary {
  last: CanaryResult | null = null;
  /** Called with every result (metrics count each run; the journal only changes). */
  onResult: ((r: CanaryResult) => void) | null = null;
  private timer: Timer | null = null;
  private running: Promise<CanaryResult> | null = null;
  /** The room of the run in flight (the background's or a /health/deep probe's). */
  private current: string | null = null;
  /** Stopped for a shutdown: a run that ends now is neither recorded nor journaled. */
  private stopped = false;
  /** The canary's own latest rooms (the last 64), so that drills can tell them from clients'. */
  readonly recentRooms = new Set<string>();

  constructor(
    private readonly control: ControlPlane,
    private readonly log: Logger,
    private readonly deadlineMs = 2000,
    private readonly clock: Clock = control.clock,
  ) {}

  /**
   * Runs one canary now (joining one already running): its verdict is the one readiness shows,
   * the one journaled when it changes, and it counts toward an engine's stall (three in a row).
   */
  run(deadlineMs = this.deadlineMs): Promise<CanaryResult> {
    this.running ??= this.once(deadlineMs)
      .then((r) => this.record(r))
      .finally(() => {
        this.running = null;
      });
    return this.running;
  }

  /**
   * A canary a client asked for (`/health/deep`): the same room through every stage, but its
   * verdict is only returned. It never counts against an engine, never changes readiness and is
   * never journaled as the canary's verdict — otherwise any caller could get healthy engines
   * reset and restarted by asking for canaries with impossible deadlines.
   */
  async probe(deadlineMs = this.deadlineMs): Promise<CanaryResult> {
    return (await this.once(deadlineMs)).result;
  }

  private async once(deadlineMs: number): Promise<Run> {
    const started = this.clock.now();
    const result = (
      ok: boolean,
      room: string | null,
      stages: CanaryResult['stages'],
      stage: string | null,
      reason: string | null,
      failure: RoomFailureReason | null = null,
    ): CanaryResult => ({
      ok,
      room,
      ms: this.clock.now() - started,
      stages,
      stage,
      reason,
      failure,
      at: started,
    });
    let stream: ReturnType<ControlPlane['submit']>;
    try {
      stream = this.control.submit({ prompt: 'canary', maxTokens: 2, source: 'canary' });
      this.current = stream.room;
      this.recentRooms.add(stream.room);
      if (this.recentRooms.size > 64) {
        const oldest = this.recentRooms.values().next().value as string;
        this.recentRooms.delete(oldest);
      }
    } catch (err) {
      const hint = err instanceof ControlError ? err.operatorHint : undefined;
      return {
        result: result(false, null, {}, 'admission', (err as Error).message),
        pair: null,
        ...(hint !== undefined ? { hint } : {}),
      };
    }
    const stages: CanaryResult['stages'] = {};
    const entered = new Map<string, number>();
    let state: RoomState = 'created';
    let pair: { prefillEngine: string; decodeEngine: string } | null = null;
    let detectedBy: string | null = null;
    entered.set('bootstrap', started);
    const off = this.control.onRoomEvent((before, after) => {
      if (after.room !== stream.room || before?.state === after.state) return;
      pair = { prefillEngine: after.prefillEngine, decodeEngine: after.decodeEngine };
      detectedBy = after.detectedBy;
      const from = before ? STAGE_OF[before.state] : undefined;
      const to = STAGE_OF[after.state];
      state = after.state;
      if (from && from !== to)
        stages[from] = after.stateSince - (entered.get(from) ?? after.stateSince);
      if (to && from !== to) entered.set(to, after.stateSince);
    });
    let timer: Timer | undefined;
    const deadline = new Promise<'deadline'>((r) => {
      timer = this.clock.setTimeout(() => r('deadline'), deadlineMs);
    });
    try {
      const outcome = await Promise.race([stream.result, deadline]);
      if (outcome === 'deadline') {
        const stage = STAGE_OF[state] ?? state;
        void this.control.abort(stream.room, 'canary_deadline', 'canary').catch(() => {});
        return {
          result: result(
            false,
            stream.room,
            stages,
            stage,
            `no progress past ${state} within ${deadlineMs} ms`,
          ),
          pair,
        };
      }
      return { result: result(true, stream.room, stages, null, null), pair };
    } catch (err) {
      const e = err as RoomEndedError;
      const stage =
        e instanceof RoomEndedError
          ? (STAGE_OF[(e.stage ?? state) as RoomState] ?? e.stage)
          : STAGE_OF[state];
      const failure =
        e instanceof RoomEndedError && e.state === 'failed' && isFailureReason(e.reason)
          ? e.reason
          : null;
      return {
        result: result(false, stream.room, stages, stage ?? null, e.message, failure),
        pair,
        ...this.drainHint(failure, detectedBy),
      };
    } finally {
      this.clock.clear(timer);
      off();
      this.current = null;
    }
  }

  /**
   * A room failed because an engine of its pair was draining: a drain someone asked for (`pdctl
   * engines drain`, a stop, the planner's retirement), and its undo. The engine that failed the
   * room says so before its next heartbeat does: it is named by the failure itself.
   */
  private drainHint(
    failure: RoomFailureReason | null,
    detectedBy: string | null,
  ): { hint?: string } {
    if (failure !== 'engine_draining') return {};
    // The engine that failed the room for it: `engine:<id>`.
    const engine = detectedBy?.startsWith('engine:') ? detectedBy.slice('engine:'.length) : null;
    return {
      hint:
        engine !== null
          ? `${engine} is draining: \`pdctl engines undrain ${engine}\` takes it back`
          : 'an engine of its pair is draining (pdctl engines shows which; `pdctl engines undrain ID` takes it back)',
    };
  }

  /**
   * Keeps the verdict, tells the control plane (`pair`: the engines its room ran on), and logs and
   * journals a change — once: a canary that keeps failing says so again only through readiness,
   * metrics and alerts. Refused because of what an operator did (every engine of a role drained or
   * cordoned), it is a warning with the operator's hint; any other failure is an error.
   */
  private record({ result: r, pair, hint }: Run): CanaryResult {
    if (this.stopped) return r;
    const prev = this.last;
    this.last = r;
    this.control.noteCanary(pair, r);
    this.onResult?.(r);
    if (!prev || prev.ok !== r.ok) {
      const failing = { room: r.room, stage: r.stage, reason: r.reason };
      if (r.ok) this.log.info({ room: r.room, ms: r.ms }, 'canary ok');
      else if (hint !== undefined) this.log.warn({ ...failing, hint }, 'canary failing');
      else this.log.error(failing, 'canary failing');
      this.control.journal
        .append({
          type: 'canary.changed',
          source: 'canary',
          data: { ok: r.ok, stage: r.stage, reason: r.reason, ms: r.ms },
        })
        .catch((err) => this.log.error({ err }, 'could not journal canary.changed'));
    }
    return r;
  }

  /** Runs every `intervalMs` in the background until stopped. */
  start(intervalMs: number): void {
    this.stopped = false;
    const tick = () => {
      void this.run().finally(() => {
        if (this.timer) this.timer = this.clock.setTimeout(tick, intervalMs);
      });
    };
    this.timer = this.clock.setTimeout(tick, 0);
  }

  /**
   * Stops the background runs. For a shutdown: the room of a run in flight is aborted (`shutdown`)
   * and awaited, so that no canary outlives the engines or reports them failing as they stop.
   */
  async stop(): Promise<void> {
    this.clock.clear(this.timer);
    this.timer = null;
    this.stopped = true;
    if (this.current) await this.control.abort(this.current, 'shutdown', 'canary').catch(() => {});
    await this.running?.catch(() => {});
  }
}
