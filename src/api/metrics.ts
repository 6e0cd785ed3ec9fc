/**
 * Prometheus metrics (prom-client), one registry per API instance. Room and stage figures come
 * from committed journal events as the control plane folds them; gauges are read at scrape time.
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import type { FastifyPluginAsync } from 'fastify';
import client from 'prom-client';
import { STAGE_OF } from '../control/canary.ts';
import type { ControlPlane } from '../control/control-plane.ts';
import type { JournalEvent } from '../journal/events.ts';
import type { Room } from '../journal/reducer.ts';
import { LIVE_STATES } from '../journal/states.ts';
import type { RecoveryView } from '../recovery/view.ts';

const STAGE_BUCKETS = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
];

export class ApiMetrics {
  readonly registry = new client.Registry();
  private readonly loopDelay = monitorEventLoopDelay({ resolution: 10 });
  private readonly ended: client.Counter<'state' | 'reason'>;
  private readonly state: client.Histogram<'state'>;
  private readonly stage: client.Histogram<'stage'>;
  /** When each live room entered its current stage (see STAGE_OF). */
  private readonly stageSince = new Map<string, number>();
  private readonly ttft: client.Histogram;
  private readonly request: client.Histogram<'kind'>;
  private readonly transfers: client.Counter<'status'>;
  private readonly transferBytes: client.Counter;
  readonly canary: client.Counter<'outcome'>;
  /** Sets the gauges from the control plane's state; run at each scrape. */
  private readonly collect: () => void;

  /** `recovery`: the ladder and restart counts of engines a stack supervises; null: none. */
  constructor(control: ControlPlane, recovery: RecoveryView | null = null) {
    const r = this.registry;
    client.collectDefaultMetrics({ register: r, prefix: 'pdctl_process_' });
    this.loopDelay.enable();
    this.ended = new client.Counter({
      name: 'pdctl_rooms_ended_total',
      help: 'Rooms that reached a terminal state, by state and reason',
      labelNames: ['state', 'reason'],
      registers: [r],
    });
    this.state = new client.Histogram({
      name: 'pdctl_state_seconds',
      help: 'Time rooms spent in each live state, from the journal',
      labelNames: ['state'],
      buckets: STAGE_BUCKETS,
      registers: [r],
    });
    this.stage = new client.Histogram({
      name: 'pdctl_stage_seconds',
      help: 'Time rooms spent in each stage (bootstrap, prefill, transfer, decode), from the journal',
      labelNames: ['stage'],
      buckets: STAGE_BUCKETS,
      registers: [r],
    });
    this.ttft = new client.Histogram({
      name: 'pdctl_time_to_first_token_seconds',
      help: 'Streaming requests: request received to first token sent',
      buckets: STAGE_BUCKETS,
      registers: [r],
    });
    this.request = new client.Histogram({
      name: 'pdctl_request_seconds',
      help: 'Completed requests, request received to last token',
      labelNames: ['kind'],
      buckets: STAGE_BUCKETS,
      registers: [r],
    });
    this.transfers = new client.Counter({
      name: 'pdctl_transfers_total',
      help: 'KV transfers by outcome',
      labelNames: ['status'],
      registers: [r],
    });
    this.transferBytes = new client.Counter({
      name: 'pdctl_transfer_bytes_total',
      help: 'KV bytes transferred',
      registers: [r],
    });
    this.canary = new client.Counter({
      name: 'pdctl_canary_runs_total',
      help: 'Canary rooms by outcome',
      labelNames: ['outcome'],
      registers: [r],
    });
    const live = new client.Gauge({
      name: 'pdctl_rooms_live',
      help: 'Rooms in each live state now',
      labelNames: ['state'],
      registers: [r],
    });
    const dropped = new client.Gauge({
      name: 'pdctl_bus_dropped_frames',
      help: 'Bus frames dropped or nacked since start, by reason',
      labelNames: ['reason'],
      registers: [r],
    });
    const hbAge = new client.Gauge({
      name: 'pdctl_engine_heartbeat_age_seconds',
      help: 'Seconds since each engine last heartbeated',
      labelNames: ['engine', 'role'],
      registers: [r],
    });
    const freePages = new client.Gauge({
      name: 'pdctl_engine_free_pages',
      help: 'Free KV pages per engine (last heartbeat)',
      labelNames: ['engine'],
      registers: [r],
    });
    const stalled = new client.Gauge({
      name: 'pdctl_engine_stalled',
      help: 'Engines stalled now, by the check that sees it (bus, transfer, work, pile_up, canary)',
      labelNames: ['engine', 'kind'],
      registers: [r],
    });
    const ladder = new client.Gauge({
      name: 'pdctl_engine_ladder',
      help: 'Where each engine stands on the escalation ladder: 1 for its phase (ok, resetting, restarting, restarting_stack, gave_up)',
      labelNames: ['engine', 'phase'],
      registers: [r],
    });
    const ladderActions = new client.Gauge({
      name: 'pdctl_engine_ladder_actions',
      help: 'In-place resets and process restarts the ladder made per engine since start',
      labelNames: ['engine', 'action'],
      registers: [r],
    });
    const batch = new client.Gauge({
      name: 'pdctl_journal_last_batch_events',
      help: 'Events in the last group commit',
      registers: [r],
    });
    const commits = new client.Gauge({
      name: 'pdctl_journal_commits',
      help: 'Transactions committed since start',
      registers: [r],
    });
    const writable = new client.Gauge({
      name: 'pdctl_journal_writable',
      help: '1 when the last commit succeeded',
      registers: [r],
    });
    const appendLatency = new client.Gauge({
      name: 'pdctl_journal_append_seconds',
      help: 'Append-to-commit latency of control-plane appends (p50, p99 over the last minute)',
      labelNames: ['quantile'],
      registers: [r],
    });
    const delay = new client.Gauge({
      name: 'pdctl_event_loop_delay_seconds',
      help: 'Event-loop delay of the control plane (p50, p99 since last scrape)',
      labelNames: ['quantile'],
      registers: [r],
    });
    const collect = () => {
      const counts = new Map<string, number>(LIVE_STATES.map((s) => [s, 0]));
      for (const room of control.liveRooms())
        if (counts.has(room.state)) counts.set(room.state, (counts.get(room.state) ?? 0) + 1);
      for (const [state, n] of counts) live.set({ state }, n);
      for (const [reason, n] of Object.entries(control.busStatus().dropped))
        dropped.set({ reason }, n ?? 0);
      const now = Date.now();
      stalled.reset();
      ladder.reset();
      for (const x of control.stalledEngines(undefined, now))
        stalled.set({ engine: x.engine, kind: x.kind }, 1);
      for (const s of control.engines()) {
        hbAge.set({ engine: s.engine, role: s.role }, (now - s.health.lastSeen) / 1000);
        if (s.health.heartbeat) freePages.set({ engine: s.engine }, s.health.heartbeat.freePages);
        const view = recovery?.ladder(s.engine);
        if (view) {
          ladder.set({ engine: s.engine, phase: view.phase }, 1);
          ladderActions.set({ engine: s.engine, action: 'reset_in_place' }, view.resets);
          ladderActions.set({ engine: s.engine, action: 'restart' }, view.restarts);
        }
      }
      const h = control.journalHealth();
      batch.set(h.lastBatchSize);
      commits.set(h.commits);
      writable.set(h.writable ? 1 : 0);
      const lat = control.appendLatency();
      appendLatency.set({ quantile: '0.5' }, lat.p50 / 1000);
      appendLatency.set({ quantile: '0.99' }, lat.p99 / 1000);
      delay.set({ quantile: '0.5' }, this.loopDelay.percentile(50) / 1e9);
      delay.set({ quantile: '0.99' }, this.loopDelay.percentile(99) / 1e9);
      this.loopDelay.reset();
    };
    this.collect = collect;
    control.onRoomEvent((before, after, ev) => this.onRoomEvent(before, after, ev));
  }

  private onRoomEvent(before: Room | null, after: Room, ev: JournalEvent): void {
    if (before && before.state !== after.state) {
      this.state.observe({ state: before.state }, Math.max(0, ev.ts - before.stateSince) / 1000);
      const from = STAGE_OF[before.state];
      const since = this.stageSince.get(after.room);
      if (from && from !== STAGE_OF[after.state] && since !== undefined) {
        this.stage.observe({ stage: from }, Math.max(0, ev.ts - since) / 1000);
      }
    }
    if (!before || STAGE_OF[before.state] !== STAGE_OF[after.state]) {
      if (STAGE_OF[after.state]) this.stageSince.set(after.room, ev.ts);
      else this.stageSince.delete(after.room);
    }
    if (after.terminalAt !== null && (!before || before.terminalAt === null)) {
      this.ended.inc({ state: after.state, reason: after.reason ?? after.finishReason ?? 'none' });
      if (after.state === 'failed' && after.reason?.startsWith('transfer_'))
        this.transfers.inc({ status: after.reason.slice(9) });
    }
    if (ev.type === 'room.transfer_completed') {
      this.transfers.inc({ status: 'ok' });
      this.transferBytes.inc((ev.data as { bytes: number }).bytes);
    }
  }

  firstToken(ms: number): void {
    this.ttft.observe(ms / 1000);
  }

  completed(kind: string, ms: number): void {
    this.request.observe({ kind }, ms / 1000);
  }

  async text(): Promise<string> {
    this.collect();
    return this.registry.metrics();
  }

  close(): void {
    this.loopDelay.disable();
  }
}

/** `GET /metrics`: the Prometheus text format. */
export const metricsRoutes: FastifyPluginAsync<{ metrics: ApiMetrics }> = async (
  app,
  { metrics },
) => {
  app.get(
    '/metrics',
    {
      schema: {
        tags: ['health'],
        summary: 'Prometheus metrics',
        response: {
          200: {
            description: 'Prometheus text exposition format 0.0.4',
            content: { 'text/plain': { schema: { type: 'string' } } },
          },
        },
      },
    },
    async (_req, reply) =>
      reply.type('text/plain; version=0.0.4; charset=utf-8').send(await metrics.text()),
  );
};
