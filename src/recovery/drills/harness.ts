/**
 * What every drill shares: a stack with the serving API in front of it, a sampler of room states
 * for the report's chart, a timeline of what the drill did, and the invariants every scenario ends
 * with — every room terminal within its deadlines, zero leaked pages, `journal verify` passing,
 * the next request served — plus, for comparison, the time a full-stack restart takes, measured
 * in the same run.
 */
import { buildApi } from '../../api/app.ts';
import { type HealthDeps, readiness } from '../../api/health.ts';
import { ApiMetrics } from '../../api/metrics.ts';
import { Canary } from '../../control/canary.ts';
import type { ControlPlane } from '../../control/control-plane.ts';
import { type Stack, type StackOptions, startStack } from '../../control/stack.ts';
import { DeterministicModel } from '../../engine/model.ts';
import { isTerminal } from '../../journal/states.ts';
import type { Logger } from '../../log.ts';
import { Load, type LoadOptions, wrongAnswers } from './load.ts';
import {
  DrillRecorder,
  type DrillReport,
  drillPassed,
  type Invariant,
  type StateSample,
} from './report.ts';

export interface DrillContext {
  stack: Stack;
  control: ControlPlane;
  /** The serving API in front of the stack, e.g. `http://127.0.0.1:40123`. */
  base: string;
  canary: Canary;
  log: Logger;
  /** Streaming clients the drill was asked for. */
  clients: number;
  /** Notes a step of the drill, now or at `at` (unix ms, e.g. an event's time). */
  mark(what: string, at?: number): void;
  check(invariant: Invariant): void;
  /** Streaming load against the API, started. */
  load(options?: Partial<LoadOptions>): Load;
  /** `/health/ready`'s verdict now. */
  ready(): boolean;
  /** Polls `/health/ready` until it is `want` (true: ready); ms it took, or NaN after `timeoutMs`. */
  waitReady(want: boolean, timeoutMs: number): Promise<number>;
  sleep(ms: number): Promise<void>;
  /**
   * Rooms may overstay a deadline between `from` and `to` (unix ms) for `why` — a journal that
   * cannot be written cannot record their failure either. Counted and shown, not failed.
   */
  excuse(from: number, to: number, why: string): void;
}

interface ScenarioBase {
  name: string;
  /** One line for `--help` and the report. */
  summary: string;
  /** `--clients` when not given. Default 8. */
  defaultClients?: number;
}

/** A drill against a stack in this process: the harness starts it and checks what all share. */
export interface StackScenario extends ScenarioBase {
  /** Extra engine flags for the stack the drill starts (after the drill defaults: they win). */
  engineArgs?: string[];
  stack?: Partial<StackOptions>;
  run(ctx: DrillContext): Promise<void>;
}

/** A drill that needs its own processes (killing the control plane): it runs everything itself. */
export interface StandaloneScenario extends ScenarioBase {
  standalone(o: DrillRunOptions): Promise<DrillReport>;
}

export type DrillScenario = StackScenario | StandaloneScenario;

export interface DrillRunOptions {
  clients: number;
  journalPath: string;
  log: Logger;
  version: string;
  /** Measure a full-stack restart after the drill, for comparison. Default true. */
  baseline?: boolean;
  /** Count missed timing targets as failures. Default false. */
  strictTargets?: boolean;
  /** Progress lines for long steps (to stderr from the CLI). */
  progress?: (line: string) => void;
  /** kill-control-plane: fill the journal with about this many events first. */
  journalEvents?: number;
}

/** Engine flags every drill stack gets: faults may be injected, and the model costs some time. */
export const DRILL_ENGINE_ARGS = [
  '--allow-fault-injection',
  '--pages',
  '65536',
  '--prefill-us-per-token',
  '100',
  '--decode-us-per-token',
  '1000',
];

export async function runDrill(scenario: DrillScenario, o: DrillRunOptions): Promise<DrillReport> {
  if ('standalone' in scenario) return scenario.standalone(o);
  const stackOptions: StackOptions = {
    journalPath: o.journalPath,
    durability: 'power',
    log: o.log,
    version: o.version,
    engineLogLevel: 'warn',
    engineEnv: { PDCTL_EXIT_WITH_PARENT: String(process.pid) },
    ...scenario.stack,
    engineArgs: [...DRILL_ENGINE_ARGS, ...(scenario.engineArgs ?? [])],
  };
  const stack = await startStack(stackOptions);
  const started = Date.now();
  const log = o.log;
  const rec = new DrillRecorder(started, (what) => log.info({ drill: scenario.name }, what));
  const { mark, check, timeline, invariants } = rec;
  const samples: StateSample[] = [];
  const { control } = stack;
  const canary = new Canary(control, log);
  canary.start(1000);
  const metrics = new ApiMetrics(control);
  const health: HealthDeps = { control, canary, heartbeatStaleMs: 2000, canaryStaleMs: 5000 };
  const app = await buildApi({
    control,
    canary,
    metrics,
    log,
    version: o.version,
    adminToken: null,
    maxRoomsPerEngine: Math.max(64, o.clients * 2),
  });
  const base = await app.listen({ host: '127.0.0.1', port: 0 });
  const model = new DeterministicModel();
  const loads: Load[] = [];
  const terminal = { completed: 0, aborted: 0, failed: 0, migrated: 0 };
  const off = control.onRoomEvent((before, after) => {
    if (isTerminal(after.state) && (!before || !isTerminal(before.state)))
      terminal[after.state as keyof typeof terminal]++;
  });
  const sampler = setInterval(() => {
    const live: Record<string, number> = {};
    for (const r of control.rooms.values())
      if (!isTerminal(r.state)) live[r.state] = (live[r.state] ?? 0) + 1;
    samples.push({ atMs: Date.now() - started, live, terminal: { ...terminal } });
  }, 100);
  const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
  const ready = () => readiness(health).ready;
  const excused: Array<{ from: number; to: number; why: string }> = [];
  const ctx: DrillContext = {
    stack,
    control,
    base,
    canary,
    log,
    clients: o.clients,
    mark,
    check,
    load: (lo = {}) => {
      const l = new Load({
        base,
        model: control.modelName,
        clients: o.clients,
        maxTokens: 48,
        ...lo,
      });
      loads.push(l.start());
      return l;
    },
    ready,
    waitReady: async (want, timeoutMs) => {
      const t0 = Date.now();
      while (Date.now() - t0 < timeoutMs) {
        if (ready() === want) return Date.now() - t0;
        await sleep(25);
      }
      return Number.NaN;
    },
    sleep,
    excuse: (from, to, why) => excused.push({ from, to, why }),
  };
  let baselineMs: number | null = null;
  try {
    await control.journal.append({
      type: 'drill.started',
      source: 'drill',
      data: { scenario: scenario.name, clients: o.clients },
    });
    mark(
      `stack up: ${stack.engineIds.prefill.length} prefill, ${stack.engineIds.decode.length} decode`,
    );
    await scenario.run(ctx);
    for (const l of loads) await l.stop();
    await commonInvariants(ctx, started, model, loads, excused);
  } catch (err) {
    rec.crashed(err);
  } finally {
    clearInterval(sampler);
    off();
    canary.stop();
    for (const l of loads) await l.stop(0);
    await app.close();
    metrics.close();
  }
  const passed = drillPassed(invariants, o.strictTargets);
  await control.journal
    .append({
      type: 'drill.finished',
      source: 'drill',
      data: {
        scenario: scenario.name,
        passed,
        invariants: invariants.map((i) => ({ name: i.name, ok: i.ok, figure: i.figure })),
      },
    })
    .catch((err) => log.error({ err }, 'could not journal drill.finished'));
  if (o.baseline !== false) baselineMs = await fullRestart(stack, stackOptions, mark);
  else await stack.stop();
  return {
    scenario: scenario.name,
    summary: scenario.summary,
    passed,
    startedAt: started,
    ms: Date.now() - started,
    timeline,
    invariants,
    samples,
    journal: o.journalPath,
    fullRestartMs: baselineMs,
  };
}

/**
 * The blind restart the incident needed, timed on this machine: stop every process, start the
 * stack again on the same journal, and serve one request.
 */
async function fullRestart(
  stack: Stack,
  options: StackOptions,
  mark: (what: string) => void,
): Promise<number | null> {
  const t0 = Date.now();
  await stack.stop();
  const again = await startStack(options);
  try {
    const canary = new Canary(again.control, options.log);
    const r = await canary.run(10_000);
    const ms = Date.now() - t0;
    mark(
      r.ok
        ? `baseline: a full-stack restart served again after ${ms} ms`
        : 'baseline: restart failed',
    );
    return r.ok ? ms : null;
  } finally {
    await again.stop();
  }
}

/** Every drill ends with these. */
async function commonInvariants(
  ctx: DrillContext,
  started: number,
  model: DeterministicModel,
  loads: Load[],
  excused: Array<{ from: number; to: number; why: string }>,
): Promise<void> {
  const { control, check } = ctx;
  // Every room of the drill terminal, and none overstayed a state's deadline by more than the
  // watchdog's reaction time.
  const settleBy = Date.now() + 15_000;
  while (Date.now() < settleBy && [...control.rooms.values()].some((r) => !isTerminal(r.state)))
    await ctx.sleep(50);
  const roomIds = await roomsSince(control, started);
  const timelines = await Promise.all(roomIds.map((r) => control.journal.timeline(r)));
  const live = timelines.filter((t) => !t.room || !isTerminal(t.room.state)).length;
  let overstayed = 0;
  let excusedSpans = 0;
  let worstMs = 0;
  for (const t of timelines) {
    if (!t.room) continue;
    for (const span of t.spans) {
      if (span.ms === null || isTerminal(span.state)) continue;
      const allowed = t.room.deadlinesMs[span.state as keyof typeof t.room.deadlinesMs];
      if (allowed === undefined) continue;
      if (span.ms <= allowed + 1000) {
        worstMs = Math.max(worstMs, span.ms - allowed);
        continue;
      }
      const end = span.from + span.ms;
      if (excused.some((w) => span.from < w.to && end > w.from)) excusedSpans++;
      else overstayed++;
    }
  }
  check({
    name: 'every room terminal within its deadlines',
    ok: live === 0 && overstayed === 0,
    figure: { rooms: roomIds.length, live, overstayed },
    detail:
      (overstayed === 0
        ? `no state held past its deadline + 1 s (worst ${Math.max(0, worstMs)} ms over)`
        : `${overstayed} state spans past their deadline + 1 s`) +
      (excusedSpans > 0
        ? `; ${excusedSpans} more overlapped the fault, excused: ${excused.map((w) => w.why).join('; ')}`
        : ''),
  });

  const records = loads.flatMap((l) => l.records);
  const wrong = wrongAnswers(records, model);
  const completed = records.filter((r) => r.outcome === 'completed');
  check({
    name: 'every answer served is the right one',
    ok: wrong.length === 0,
    figure: { completed: completed.length, wrong: wrong.length },
    detail:
      wrong.length === 0
        ? 'each completed text equals the model run in-process'
        : `wrong text in rooms ${wrong
            .map((r) => r.room)
            .slice(0, 5)
            .join(', ')}`,
  });
  // Acknowledged work is in the journal: every request answered in full has its room completed.
  // A migrated request's journal record is its chain of rooms: each migrated to the next, the
  // last completed.
  const missing: string[] = [];
  let migrated = 0;
  for (const r of completed) {
    let t = r.room ? await control.journal.timeline(r.room) : null;
    for (let hops = 0; t?.room?.state === 'migrated' && t.room.migratedTo && hops < 10; hops++) {
      migrated++;
      t = await control.journal.timeline(t.room.migratedTo);
    }
    if (t?.room?.state !== 'completed') missing.push(r.room ?? '(no room id)');
  }
  check({
    name: 'no answered request missing from the journal',
    ok: missing.length === 0,
    figure: { answered: completed.length, missing: missing.length, migrations: migrated },
    detail:
      missing.length === 0
        ? 'each has its room (or the last of its migrated rooms) completed'
        : missing.slice(0, 5).join(', '),
  });

  const leaked = await leakedPages(control, 10_000);
  check({
    name: 'zero leaked pages',
    ok: leaked === 0,
    figure: { pages: Number.isNaN(leaked) ? 'unknown' : leaked },
    detail: 'free = capacity on every engine',
  });
  const verify = await control.journal.verify();
  check({
    name: 'journal verify passes',
    ok: verify.ok,
    figure: { events: verify.events },
    detail: verify.ok ? 'projection equals the fold' : verify.problems.slice(0, 3).join('; '),
  });
  const next = await ctx.canary.run(2000);
  ctx.mark(
    next.ok ? `next request served in ${next.ms} ms` : `next request failed in ${next.stage}`,
  );
  check({
    name: 'the next request succeeds',
    ok: next.ok,
    figure: { ms: next.ms },
    detail: next.ok ? 'canary room completed' : `${next.stage}: ${next.reason}`,
  });
}

/** Rooms created since `since` (unix ms), canaries included. */
async function roomsSince(control: ControlPlane, since: number): Promise<string[]> {
  const ids: string[] = [];
  let cursor: string | undefined;
  do {
    const page = await control.journal.rooms({ since, limit: 10_000, cursor });
    for (const r of page.rooms) ids.push(r.room);
    cursor = page.nextCursor ?? undefined;
  } while (cursor);
  return ids;
}

/** Pages not free across all engines, from heartbeats sent after now; NaN if none came in time. */
async function leakedPages(control: ControlPlane, timeoutMs: number): Promise<number> {
  const since = Date.now();
  let leaked = Number.NaN;
  while (Date.now() - since < timeoutMs) {
    const engines = control.registry.all().filter((e) => e.live);
    if (engines.length > 0 && engines.every((e) => e.heartbeat && e.lastSeen > since)) {
      leaked = engines.reduce((n, e) => n + (e.pages - (e.heartbeat?.freePages ?? 0)), 0);
      if (leaked === 0) return 0;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return leaked;
}
