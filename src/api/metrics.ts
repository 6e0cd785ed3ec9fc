/**
 * Prometheus metrics (prom-client), one registry per API instance, named by Prometheus's
 * conventions: counters end in `_total`, durations are histograms in seconds, sizes in bytes.
 * Room and stage figures come from committed journal events as the control plane folds them;
 * running totals kept elsewhere (journal commits, bus drops, ladder actions, the engines' own
 * loop ticks from their heartbeats) are counters read at scrape time; gauges are read then too.
 */
import type { FastifyPluginAsync } from 'fastify';
import client from 'prom-client';
import type { ControlPlane } from '../control/control-plane.ts';
import { STAGE_OF } from '../control/evidence/canary.ts';
import type { FlowControl } from '../control/flow/flow-control.ts';
import { MAX_COUNTED_DEPTH } from '../control/rooms/commit-depth.ts';
import type { Retention } from '../journal/retention.ts';
import type { JournalDisk, JournalReader } from '../journal/store.ts';
import type { Planner } from '../planner/online.ts';
import { EXIT_CAUSES, RESTARTERS } from '../recovery/supervisor.ts';
import type { RecoveryView } from '../recovery/view.ts';
import { type JournalEvent, type JournalEventOf, KV_TRANSPORTS } from '../room/events.ts';
import { ID_PATTERN } from '../room/ids.ts';
import {
  ABORT_REASONS,
  FAILURE_REASONS,
  isFailureReason,
  MIGRATION_REASONS,
  TRANSFER_FAILURES,
} from '../room/reasons.ts';
import type { Room } from '../room/reducer.ts';
import { LIVE_STATES } from '../room/states.ts';
import { BAND_ORDER, WAIT_REASONS } from '../tenants/flow.ts';
import { COMPLETION_ROUTES, REFUSAL_CODES } from './errors.ts';
import { BoundedLabel } from './labels.ts';

/** Tenants with a label of their own; past these, `other` (tenants are the operator's, few). */
const TENANT_LABELS = 100;
/** A tenant's name as the journal allows it (tenant.added's `Id`). */
const TENANT_NAME = new RegExp(ID_PATTERN);
const TENANT_OUTCOMES = ['answered', 'refused', 'shed', 'failed'] as const;

const STAGE_BUCKETS = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
];

/**
 * Label values exported at 0 from the start: a counter whose series appears only with its first
 * event starts at 1, and `increase()` never sees that first one — the first failure of a kind is
 * the one an alert must not miss.
 */
const KNOWN_ENDINGS: ReadonlyArray<readonly [state: string, reason: string]> = [
  ['completed', 'length'],
  ['completed', 'stop'],
  // Every abort, failure and migration reason of the lists (journal/reasons.ts).
  ...ABORT_REASONS.map((r) => ['aborted', r] as const),
  ...FAILURE_REASONS.map((r) => ['failed', r] as const),
  ...MIGRATION_REASONS.map((r) => ['migrated', r] as const),
];
/** A transfer's `status` label: `ok`, or the failure of the list it ended with (`transferFailure`). */
const TRANSFER_STATUSES = ['ok', ...Object.keys(TRANSFER_FAILURES).map(transferStatus)];
const KNOWN_STATUSES = ['200', '400', '409', '429', '500', '503', '504'];
const CANARY_OUTCOMES = [
  'ok',
  'failing_admission',
  'failing_bootstrap',
  'failing_prefill',
  'failing_transfer',
  'failing_decode',
];

/**
 * A counter whose running total is kept elsewhere and read at each scrape (it only grows, and
 * starts again from 0 only when the process that keeps it restarts, as Prometheus expects).
 */
function totalCounter<L extends string>(
  r: client.Registry,
  name: string,
  help: string,
  labelNames: readonly L[],
  read: () => Array<[Partial<Record<L, string>>, number]>,
): client.Counter<L> {
  return new client.Counter<L>({
    name,
    help,
    labelNames,
    registers: [r],
    collect() {
      this.reset();
      for (const [labels, n] of read()) this.inc(labels, Math.max(0, n));
    },
  });
}

export class ApiMetrics {
  readonly registry = new client.Registry();
  private readonly ended: client.Counter<'state' | 'reason'>;
  private readonly state: client.Histogram<'state'>;
  private readonly stage: client.Histogram<'stage'>;
  /** When each live room entered its current stage (see STAGE_OF). */
  private readonly stageSince = new Map<string, number>();
  private readonly ttft: client.Histogram;
  private readonly interToken: client.Histogram;
  private readonly request: client.Histogram<'kind'>;
  private readonly promptTokens: client.Counter;
  private readonly responses: client.Counter<'route' | 'status'>;
  private readonly transfers: client.Counter<'status' | 'transport'>;
  /** How each live room's pair was to move its KV (`room.created.transport`), until it ends. */
  private readonly plannedTransport = new Map<string, string>();
  /** KV transfers each engine took part in since this process started, by transport. */
  private readonly byEngine = new Map<string, Record<string, number>>();
  private readonly transferBytes: client.Counter;
  /** Prefix blocks of each room's context (`room.created.prefixBlocks`), until its KV is posted. */
  private readonly prefixBlocks = new Map<string, number>();
  private readonly blocks: client.Counter<'outcome'>;
  private readonly canaryRuns: client.Counter<'outcome'>;
  /** Bounded label values: a room's reason and a canary's outcome come from the journal. */
  private readonly reasons = new BoundedLabel(KNOWN_ENDINGS.map(([, r]) => r));
  private readonly outcomes = new BoundedLabel(CANARY_OUTCOMES);
  private readonly statuses = new BoundedLabel(TRANSFER_STATUSES);
  private readonly refusals: client.Counter<'reason'>;
  private readonly refusalReasons = new BoundedLabel(REFUSAL_CODES);
  private readonly waits: client.Histogram<'reason'>;
  private readonly waitReasons = new BoundedLabel(WAIT_REASONS);
  /** Per tenant (`tenant` label: its name, `none` without a key, `other` past the first 100). */
  private readonly tenantRequests: client.Counter<'tenant' | 'outcome'>;
  private readonly tenantTokens: client.Counter<'tenant' | 'kind'>;
  private readonly tenantWaits: client.Counter<'tenant'>;
  private readonly tenantNames = new BoundedLabel([], TENANT_LABELS, TENANT_NAME);
  /** Tenant labels whose series exist (at 0 from the first scrape that knew the tenant). */
  private readonly tenantSeries = new Set<string>();
  /** Flow control's queue, once the API has one (`watchFlow`). */
  private flow: Pick<FlowControl, 'snapshot'> | null = null;
  /** Sets the gauges from the control plane's state; run at each scrape. */
  private readonly collect: () => void;

  /** What the journal took on disk at the last scrape (read before `collect`). */
  private disk: JournalDisk | null = null;
  private readonly journalReader: Pick<JournalReader, 'diskUsage'>;

  /**
   * `recovery`: the ladder and restart counts of engines a stack supervises; null: none.
   * `retention`: the journal's retention while serving, whose totals it counts; null: none.
   * `planner`: whose last proposal `pdctl_planner_desired_engines` shows; null: none.
   */
  constructor(
    control: ControlPlane,
    recovery: RecoveryView | null = null,
    retention: Retention | null = null,
    planner: Pick<Planner, 'status'> | null = null,
  ) {
    const r = this.registry;
    this.journalReader = control.journal;
    // process_cpu_seconds_total, nodejs_eventloop_lag_seconds, … under pdctl_.
    client.collectDefaultMetrics({ register: r, prefix: 'pdctl_' });
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
    this.interToken = new client.Histogram({
      name: 'pdctl_inter_token_latency_seconds',
      help: 'Streaming requests: time between tokens sent (per chunk, over its tokens)',
      buckets: [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
      ],
      registers: [r],
    });
    this.promptTokens = new client.Counter({
      name: 'pdctl_prompt_tokens_total',
      help: 'Prompt tokens of the requests admitted (canary rooms included)',
      registers: [r],
    });
    this.responses = new client.Counter({
      name: 'pdctl_http_responses_total',
      help: 'HTTP responses by route pattern and status (400s and 429s included)',
      labelNames: ['route', 'status'],
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
      help: 'KV transfers by outcome and transport (shm, cuda, ucx; unknown before it was recorded)',
      labelNames: ['status', 'transport'],
      registers: [r],
    });
    this.transferBytes = new client.Counter({
      name: 'pdctl_transfer_bytes_total',
      help: 'KV bytes transferred',
      registers: [r],
    });
    this.blocks = new client.Counter({
      name: 'pdctl_prefix_blocks_total',
      help: 'Prefix blocks of rooms prefilled: hit (KV reused from the prefill engine cache), missed (computed), stored and evicted by the caches',
      labelNames: ['outcome'],
      registers: [r],
    });
    for (const outcome of ['hit', 'missed', 'stored', 'evicted']) this.blocks.inc({ outcome }, 0);
    this.canaryRuns = new client.Counter({
      name: 'pdctl_canary_runs_total',
      help: 'Canary rooms by outcome (ok, or failing_ and the stage it failed in)',
      labelNames: ['outcome'],
      registers: [r],
    });
    for (const outcome of CANARY_OUTCOMES) this.canaryRuns.inc({ outcome }, 0);
    this.refusals = new client.Counter({
      name: 'pdctl_requests_refused_total',
      help: 'Completions refused before a room existed, by reason (each is also journaled: request.refused)',
      labelNames: ['reason'],
      registers: [r],
    });
    for (const reason of REFUSAL_CODES) this.refusals.inc({ reason }, 0);
    this.waits = new client.Histogram({
      name: 'pdctl_request_wait_seconds',
      help: "Completions taken after waiting in flow control's queue: how long, by what held them (each is also journaled: request.waited)",
      labelNames: ['reason'],
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers: [r],
    });
    for (const reason of WAIT_REASONS) this.waits.zero({ reason });
    this.tenantRequests = new client.Counter({
      name: 'pdctl_tenant_requests_total',
      help: 'Completions per tenant by outcome: answered, refused (its limit, its time-to-live, no engines), shed (queue full), failed (a room but no answer)',
      labelNames: ['tenant', 'outcome'],
      registers: [r],
    });
    this.tenantTokens = new client.Counter({
      name: 'pdctl_tenant_tokens_total',
      help: "Tokens of each tenant's answered completions, as its clients were told (kind: prompt, completion)",
      labelNames: ['tenant', 'kind'],
      registers: [r],
    });
    this.tenantWaits = new client.Counter({
      name: 'pdctl_tenant_wait_seconds_total',
      help: "Time each tenant's completions waited in flow control's queue before they were taken",
      labelNames: ['tenant'],
      registers: [r],
    });
    // An open API's requests (`none`) from the start; each tenant's from the first scrape.
    this.tenantLabel(null);
    const flowOf = () => this.flow;
    new client.Gauge({
      name: 'pdctl_queue_waiting',
      help: "Completions waiting in flow control's queue now, by band",
      labelNames: ['band'],
      registers: [r],
      collect() {
        const snap = flowOf()?.snapshot();
        for (const band of BAND_ORDER) this.set({ band }, snap?.[band].requests ?? 0);
      },
    });
    new client.Gauge({
      name: 'pdctl_queue_oldest_wait_seconds',
      help: "How long the oldest completion waiting in flow control's queue has waited, by band (0: none waits)",
      labelNames: ['band'],
      registers: [r],
      collect() {
        const snap = flowOf()?.snapshot();
        for (const band of BAND_ORDER) this.set({ band }, (snap?.[band].oldestMs ?? 0) / 1000);
      },
    });
    for (const [state, reason] of KNOWN_ENDINGS) this.ended.inc({ state, reason }, 0);
    for (const route of COMPLETION_ROUTES)
      for (const status of KNOWN_STATUSES) this.responses.inc({ route, status }, 0);
    for (const transport of KV_TRANSPORTS)
      for (const status of TRANSFER_STATUSES) this.transfers.inc({ status, transport }, 0);
    const live = new client.Gauge({
      name: 'pdctl_rooms_live',
      help: 'Rooms in each live state now',
      labelNames: ['state'],
      registers: [r],
    });
    const hbAge = new client.Gauge({
      name: 'pdctl_engine_heartbeat_age_seconds',
      help: 'Seconds since each engine last heartbeated',
      labelNames: ['engine', 'role'],
      registers: [r],
    });
    const ready = new client.Gauge({
      name: 'pdctl_engines_ready',
      help: 'Engines of each role that take new rooms now: a fresh heartbeat, not draining (0: every request of that role is refused)',
      labelNames: ['role'],
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
      help: 'Where each engine stands on the escalation ladder: 1 for its phase (ok, resetting, restarting, restarting_stack, fenced, cordoned, gave_up)',
      labelNames: ['engine', 'phase'],
      registers: [r],
    });
    const ejected = new client.Gauge({
      name: 'pdctl_engine_ejected',
      help: 'Engines out of rotation now as outliers (no rooms until a canary through them passes)',
      labelNames: ['engine'],
      registers: [r],
    });
    const cordoned = new client.Gauge({
      name: 'pdctl_engine_cordoned',
      help: 'Engines cordoned now (no new rooms until `pdctl engines uncordon`), by who cordoned them (ladder, operator)',
      labelNames: ['engine', 'by'],
      registers: [r],
    });
    const batch = new client.Gauge({
      name: 'pdctl_journal_last_batch_events',
      help: 'Events in the last group commit',
      registers: [r],
    });
    const writable = new client.Gauge({
      name: 'pdctl_journal_writable',
      help: '1 when the last commit succeeded',
      registers: [r],
    });
    const journalBytes = new client.Gauge({
      name: 'pdctl_journal_bytes',
      help: 'What the journal takes on disk: SQLite its file and WAL, PostgreSQL its tables and indexes',
      registers: [r],
    });
    const diskFree = new client.Gauge({
      name: 'pdctl_journal_disk_free_bytes',
      help: 'SQLite: free bytes on the filesystem of the journal (absent on PostgreSQL: watch the database host)',
      registers: [r],
    });
    totalCounter(
      r,
      'pdctl_journal_pruned_total',
      'What retention deleted since start (serve --retain, journal prune --url): rooms, their events, events of no room',
      ['what'],
      () => {
        const t = retention?.status().totals;
        return t
          ? [
              [{ what: 'rooms' }, t.rooms],
              [{ what: 'room_events' }, t.events],
              [{ what: 'other_events' }, t.otherEvents],
            ]
          : [];
      },
    );
    new client.Gauge({
      name: 'pdctl_planner_desired_engines',
      help: "The planner's proposal, engines of each role (its last decision; absent before the first, or with --planner off): for an outside autoscaler",
      labelNames: ['role'],
      registers: [r],
      collect() {
        this.reset();
        const last = planner?.status().last;
        if (last)
          for (const role of ['prefill', 'decode'] as const)
            this.set({ role }, last.proposal[role]);
      },
    });
    const term = new client.Gauge({
      name: 'pdctl_journal_term',
      help: 'PostgreSQL journal: the leadership term this control plane writes under (a failover takes a higher one); 0 on SQLite',
      registers: [r],
    });
    totalCounter(
      r,
      'pdctl_bus_dropped_frames_total',
      'Bus frames dropped or nacked, by reason',
      ['reason'],
      () => Object.entries(control.busStatus().dropped).map(([reason, n]) => [{ reason }, n ?? 0]),
    );
    totalCounter(
      r,
      'pdctl_bus_frames_total',
      'Bus frames the control plane received from engines and sent to them (a batch is one frame): each costs both ends and their ZeroMQ threads CPU',
      ['direction'],
      () => {
        const { frames } = control.busStatus();
        return [
          [{ direction: 'received' }, frames.received],
          [{ direction: 'sent' }, frames.sent],
        ];
      },
    );
    totalCounter(
      r,
      'pdctl_engine_ladder_actions_total',
      'In-place resets and process restarts the ladder made, per engine',
      ['engine', 'action'],
      () =>
        control.engines().flatMap((s) => {
          const view = recovery?.ladder(s.engine);
          if (!view) return [];
          return [
            [{ engine: s.engine, action: 'reset_in_place' }, view.resets],
            [{ engine: s.engine, action: 'restart' }, view.restarts],
          ] as Array<[{ engine: string; action: string }, number]>;
        }),
    );
    // Every engine process exit and restart, the supervisor's and the ladder's: a crash loop
    // shows here whoever restarts the engine.
    totalCounter(
      r,
      'pdctl_engine_exits_total',
      `Engine process exits by cause (${EXIT_CAUSES.join(', ')}), per engine this control plane started`,
      ['engine', 'cause'],
      () =>
        [...(recovery?.tallies() ?? [])].flatMap(([engine, t]) =>
          EXIT_CAUSES.map(
            (cause) =>
              [{ engine, cause }, t.exits[cause]] as [{ engine: string; cause: string }, number],
          ),
        ),
    );
    totalCounter(
      r,
      'pdctl_engine_restarts_total',
      `Engine processes started again, by who (${RESTARTERS.join(', ')}), per engine`,
      ['engine', 'by'],
      () =>
        [...(recovery?.tallies() ?? [])].flatMap(([engine, t]) =>
          RESTARTERS.map(
            (by) => [{ engine, by }, t.restarts[by]] as [{ engine: string; by: string }, number],
          ),
        ),
    );
    totalCounter(r, 'pdctl_journal_commits_total', 'Journal transactions committed', [], () => [
      [{}, control.journalHealth().commits],
    ]);
    totalCounter(
      r,
      'pdctl_prefix_blocks_refused_total',
      'Prefix blocks engines said they stored that were not theirs to store (not blocks of the room, beyond their cache, or a block size the control plane does not use): never indexed',
      [],
      () => [[{}, control.counters.blocksRefused]],
    );
    totalCounter(
      r,
      'pdctl_first_token_commits_total',
      `Rooms by the journal commits in sequence behind their first token (docs/critical-path.md); ${MAX_COUNTED_DEPTH} counts that many or more`,
      ['commits'],
      () =>
        control.book
          .firstTokenCommits()
          .flatMap((n, d) =>
            d === 0 ? [] : [[{ commits: String(d) }, n] as [{ commits: string }, number]],
          ),
    );
    totalCounter(
      r,
      'pdctl_page_map_conflicts_total',
      "Pages a decode engine reserved while the control plane's page map still held them for another room (docs/critical-path.md): 0 unless engine and control plane disagree about a pool",
      [],
      () => [[{}, control.book.pageConflicts]],
    );
    totalCounter(
      r,
      'pdctl_generation_tokens_total',
      'Tokens streamed to clients (canary rooms included)',
      [],
      () => [[{}, control.counters.tokens]],
    );
    totalCounter(
      r,
      'pdctl_engine_loop_ticks_total',
      "Each engine's loop ticks (bus, work, transfer, heartbeat), from its heartbeats; one that stops moving is a frozen loop",
      ['engine', 'loop'],
      () =>
        control
          .engines()
          .flatMap((s) =>
            Object.entries(s.heartbeat?.ticks ?? {}).map(
              ([loop, n]) =>
                [{ engine: s.engine, loop }, n] as [{ engine: string; loop: string }, number],
            ),
          ),
    );
    const appendSeconds = new client.Histogram({
      name: 'pdctl_journal_append_seconds',
      help: 'Append-to-commit time of control-plane appends',
      buckets: STAGE_BUCKETS,
      registers: [r],
    });
    control.onAppendCommitted((ms) => appendSeconds.observe(ms / 1000));
    const pages = new client.Gauge({
      name: 'pdctl_engine_pages',
      help: "KV pages in each engine's pool (with pdctl_engine_free_pages: its usage)",
      labelNames: ['engine'],
      registers: [r],
    });
    const queues = new client.Gauge({
      name: 'pdctl_engine_queue_depth',
      help: "Each engine's queues (waiting, active, transferring, decoding, outbox, unacked), last heartbeat",
      labelNames: ['engine', 'queue'],
      registers: [r],
    });
    new client.Gauge({
      name: 'pdctl_model_info',
      help: 'The model served (1, labelled by its name)',
      labelNames: ['model'],
      registers: [r],
    }).set({ model: control.modelInfo.name }, 1);
    const collect = () => {
      for (const t of control.tenants.list()) if (t.revokedAt === null) this.tenantLabel(t.name);
      const counts = new Map<string, number>(LIVE_STATES.map((s) => [s, 0]));
      for (const room of control.liveRooms())
        if (counts.has(room.state)) counts.set(room.state, (counts.get(room.state) ?? 0) + 1);
      for (const [state, n] of counts) live.set({ state }, n);
      const now = Date.now();
      const found = control.stalledEngines(undefined, now);
      const engines = control.engines(now, found);
      for (const role of ['prefill', 'decode'] as const)
        ready.set({ role }, engines.filter((e) => e.role === role && e.takesRooms).length);
      stalled.reset();
      ladder.reset();
      for (const x of found) stalled.set({ engine: x.engine, kind: x.kind }, 1);
      ejected.reset();
      for (const [engine] of control.registry.ejections.all()) ejected.set({ engine }, 1);
      cordoned.reset();
      for (const [engine, c] of control.registry.cordons.all())
        cordoned.set({ engine, by: c.by }, 1);
      for (const s of engines) {
        hbAge.set({ engine: s.engine, role: s.role }, (now - s.lastSeen) / 1000);
        pages.set({ engine: s.engine }, s.pages);
        const hb = s.heartbeat;
        if (hb) {
          freePages.set({ engine: s.engine }, hb.freePages);
          for (const [queue, n] of Object.entries(hb.queues))
            queues.set({ engine: s.engine, queue }, n);
        }
        const view = recovery?.ladder(s.engine);
        if (view) ladder.set({ engine: s.engine, phase: view.phase }, 1);
      }
      const h = control.journalHealth();
      batch.set(h.lastBatchSize);
      writable.set(h.writable ? 1 : 0);
      term.set(h.term ?? 0);
      if (this.disk) {
        journalBytes.set(this.disk.bytes);
        if (this.disk.freeBytes !== null) diskFree.set(this.disk.freeBytes);
      }
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
    // A migrated room's prompt holds tokens already counted: only a request's first room counts.
    if (!before && after.migratedFrom === null) this.promptTokens.inc(after.promptTokens ?? 0);
    if (ev.type === 'room.created') {
      const planned = ev.data.transport;
      if (planned) this.plannedTransport.set(after.room, planned);
      if (ev.data.prefixBlocks) this.prefixBlocks.set(after.room, ev.data.prefixBlocks);
    }
    if (ev.type === 'room.prefill_started' || ev.type === 'room.transfer_posted')
      this.onBlocks(after.room, ev);
    if (ev.type === 'room.transfer_completed') {
      const { bytes, transport = 'unknown' } = ev.data;
      this.transfers.inc({ status: 'ok', transport });
      this.transferBytes.inc(bytes);
      for (const engine of new Set([after.prefillEngine, after.decodeEngine])) {
        const tally = this.byEngine.get(engine) ?? {};
        tally[transport] = (tally[transport] ?? 0) + 1;
        this.byEngine.set(engine, tally);
      }
    }
    if (after.terminalAt !== null && (!before || before.terminalAt === null)) {
      this.ended.inc({
        state: after.state,
        reason: this.reasons.of(after.reason ?? after.finishReason),
      });
      const failure = after.state === 'failed' ? transferFailure(after.reason) : null;
      if (failure)
        this.transfers.inc({
          status: this.statuses.of(failure),
          transport: this.plannedTransport.get(after.room) ?? 'unknown',
        });
      this.plannedTransport.delete(after.room);
      this.prefixBlocks.delete(after.room);
    }
  }

  /** What a prefill engine's cache did for a room. */
  private onBlocks(
    room: string,
    ev: JournalEventOf<'room.prefill_started'> | JournalEventOf<'room.transfer_posted'>,
  ): void {
    this.blocks.inc({ outcome: 'evicted' }, ev.data.evictedBlocks?.length ?? 0);
    if (ev.type !== 'room.transfer_posted') return;
    const { reusedBlocks = 0, storedBlocks = [] } = ev.data;
    this.blocks.inc({ outcome: 'stored' }, storedBlocks.length);
    this.blocks.inc({ outcome: 'hit' }, reusedBlocks);
    const all = this.prefixBlocks.get(room);
    if (all !== undefined) this.blocks.inc({ outcome: 'missed' }, Math.max(0, all - reusedBlocks));
    this.prefixBlocks.delete(room);
  }

  /** A completion was refused before it had a room (`reason`: its API error code). */
  refused(reason: string, tenant: string | null = null): void {
    this.refusals.inc({ reason: this.refusalReasons.of(reason) });
    const outcome = reason === 'queue_full' ? 'shed' : 'refused';
    this.tenantRequests.inc({ tenant: this.tenantLabel(tenant), outcome });
  }

  /** A completion was taken after waiting `ms` in flow control's queue for `reason`. */
  waited(reason: string, ms: number, tenant: string | null = null): void {
    this.waits.observe({ reason: this.waitReasons.of(reason) }, ms / 1000);
    this.tenantWaits.inc({ tenant: this.tenantLabel(tenant) }, ms / 1000);
  }

  /** A tenant's completion was answered with these tokens (its `usage`). */
  answered(tenant: string | null, promptTokens: number, completionTokens: number): void {
    const label = this.tenantLabel(tenant);
    this.tenantRequests.inc({ tenant: label, outcome: 'answered' });
    this.tenantTokens.inc({ tenant: label, kind: 'prompt' }, promptTokens);
    this.tenantTokens.inc({ tenant: label, kind: 'completion' }, completionTokens);
  }

  /** A tenant's completion had a room but no answer (it failed or was aborted). */
  unanswered(tenant: string | null): void {
    this.tenantRequests.inc({ tenant: this.tenantLabel(tenant), outcome: 'failed' });
  }

  /** The tenant's label, its series made at 0 the first time (an alert's first rate sees them). */
  private tenantLabel(tenant: string | null): string {
    const label = this.tenantNames.of(tenant);
    if (!this.tenantSeries.has(label)) {
      this.tenantSeries.add(label);
      for (const outcome of TENANT_OUTCOMES) this.tenantRequests.inc({ tenant: label, outcome }, 0);
      for (const kind of ['prompt', 'completion'])
        this.tenantTokens.inc({ tenant: label, kind }, 0);
      this.tenantWaits.inc({ tenant: label }, 0);
    }
    return label;
  }

  /** The queue `pdctl_queue_waiting` and `pdctl_queue_oldest_wait_seconds` read at each scrape. */
  watchFlow(flow: Pick<FlowControl, 'snapshot'>): void {
    this.flow = flow;
  }

  /** A canary run ended: `ok`, or `failing_` and the stage it failed in. */
  canary(ok: boolean, stage: string | null): void {
    this.canaryRuns.inc({ outcome: this.outcomes.of(ok ? 'ok' : `failing_${stage ?? 'unknown'}`) });
  }

  /** KV transfers the engine took part in (either end) since this process started, by transport. */
  transfersOf(engine: string): Record<string, number> {
    return { ...(this.byEngine.get(engine) ?? {}) };
  }

  firstToken(ms: number): void {
    this.ttft.observe(ms / 1000);
  }

  /** A chunk of `tokens` arrived `ms` after the one before it (streaming). */
  chunkAfter(ms: number, tokens: number): void {
    if (tokens > 0) this.interToken.observe(ms / 1000 / tokens);
  }

  /** An HTTP response finished (every route, streams included). */
  response(route: string, status: number): void {
    // Routes are fastify's patterns (bounded); statuses are three digits.
    this.responses.inc({ route, status: String(status) });
  }

  completed(kind: string, ms: number): void {
    this.request.observe({ kind }, ms / 1000);
  }

  async text(): Promise<string> {
    this.disk = await this.journalReader.diskUsage().catch(() => null);
    this.collect();
    return this.registry.metrics();
  }
}

/**
 * The `status` a failed room's reason gives `pdctl_transfers_total`: each failure of moving the KV
 * (journal/reasons.ts `TRANSFER_FAILURES`). Null: the room failed for another reason.
 */
function transferFailure(reason: string | null): string | null {
  return isFailureReason(reason) && TRANSFER_FAILURES[reason] ? transferStatus(reason) : null;
}

/** `transfer_stalled` → `stalled`; a refusal of the pair (`decode_pool_stale`) stays as it is. */
function transferStatus(reason: string): string {
  return reason.startsWith('transfer_') ? reason.slice('transfer_'.length) : reason;
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
