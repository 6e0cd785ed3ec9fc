import { startServing } from '../app/serving.ts';
import { type Stack, type StackOptions, startStack } from '../app/stack.ts';
import { Canary } from '../control/evidence/canary.ts';
import { llamaEngineFlags, threadsPerEngine } from '../engine/options.ts';
import type { Logger } from '../log.ts';
import { DETERMINISTIC_MODEL_NAME, DeterministicModel } from '../model/deterministic.ts';
import { isTerminal } from '../room/states.ts';
import { Load, type LoadOptions, type RequestRecord, wrongAnswers } from './load.ts';
import { sleep, until } from './poll.ts';
import { type RemoteTarget, TargetError } from './remote-target.ts';
import {
  compareRecovery,
  DrillRecorder,
  type DrillReport,
  drillPassed,
  type InPlace,
  type Invariant,
  type StateSample,
} from './report.ts';
import { type DrillTarget, type EngineView, LocalTarget } from './target.ts';

export interface DrillContext {
  /** The stack under drill: one this process started, or a `pdctl serve` at `--url`. */
  target: DrillTarget;
  /** The stack this process started; null under `--url`. */
  local: LocalTarget | null;
  /** The engines by role when the drill began. */
  engineIds: { prefill: string[]; decode: string[] };
  /** The serving API, e.g. `http://127.0.0.1:40123`. */
  base: string;
  log: Logger;
  /** Streaming clients the drill was asked for. */
  clients: number;
  /** Notes a step of the drill, now or at `at` (unix ms, e.g. an event's time). */
  mark(what: string, at?: number): void;
  check(invariant: Invariant): void;
  /** Streaming load against the API, started. */
  load(options?: Partial<LoadOptions>): Load;
  /** Polls `/health/ready` until it is `want` (true: ready); ms it took, or NaN after `timeoutMs`. */
  waitReady(want: boolean, timeoutMs: number): Promise<number>;
  sleep(ms: number): Promise<void>;
  /**
   * Rooms may overstay a deadline between `from` and `to` (unix ms) for `why` — a journal that
   * cannot be written cannot record their failure either. Counted and shown, not failed.
   */
  excuse(from: number, to: number, why: string): void;
  /** A stall the ladder ended in place: fault → detected, and detected → serving again (ms). */
  recoveredInPlace(figures: InPlace): void;
}

/** What a drill needs of a stack it did not start (`--url`). */
export interface RemoteNeeds {
  /** It cannot run against such a stack at all, and why. */
  unsupported?: string;
  /** It injects faults: the engines must accept `inject_fault`. */
  faults?: boolean;
  /** It signals engine processes: the stack must run on this host. */
  signals?: boolean;
}

interface ScenarioBase {
  name: string;
  /** One line for `--help` and the report. */
  summary: string;
  /** `--clients` when not given. Default 8. */
  defaultClients?: number;
  remote?: RemoteNeeds;
}

/** A drill against a stack: the harness starts it (or connects to one) and checks what all share. */
export interface StackScenario extends ScenarioBase {
  /** Extra engine flags for the stack the drill starts (after the drill defaults: they win). */
  engineArgs?: string[];
  stack?: Partial<StackOptions>;
  /** The background canary's interval in ms (default 1000; 0: none, for a drill that saturates the fleet). */
  canaryIntervalMs?: number;
  run(ctx: DrillContext): Promise<void>;
}

/** A drill that needs its own processes (killing the control plane): it runs everything itself. */
export interface StandaloneScenario extends ScenarioBase {
  remote: RemoteNeeds & { unsupported: string };
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
  /**
   * control-plane-failover: the PostgreSQL server to create the drill's journal database on (a
   * URL whose user may CREATE DATABASE). Default: a throwaway cluster started with initdb.
   */
  postgresUrl?: string;
  /** A drill that cannot run here (no PostgreSQL) is skipped instead of failed (`drill all`). */
  skipUnavailable?: boolean;
  /** kill-control-plane: fill the journal with about this many events first. */
  journalEvents?: number;
  /** Serve this llama.cpp model (a GGUF file) instead of the built-in one. */
  model?: { path: string; sequences: number } | null;
  /** Options for the stacks the drills start, over each scenario's (`--no-outlier-ejection`, `--retry-limit`). */
  stack?: Partial<StackOptions>;
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

/**
 * The flags of a drill's engines: the drill defaults, the scenario's, and with a llama.cpp model
 * its file and sequences (and the machine's cores shared between the two engines).
 */
export function drillEngineArgs(o: DrillRunOptions, scenario: string[] = []): string[] {
  const model = o.model
    ? llamaEngineFlags({
        modelPath: o.model.path,
        sequences: o.model.sequences,
        threads: threadsPerEngine(2),
      })
    : [];
  return [...DRILL_ENGINE_ARGS, ...scenario, ...model];
}

/** With a llama.cpp model, the `pdctl serve` flags that name it. */
export function drillServeArgs(o: DrillRunOptions): string[] {
  return o.model ? ['--model', o.model.path, '--sequences', String(o.model.sequences)] : [];
}

/** Runs a drill on a stack it starts, then times a full-stack restart on the same journal. */
export async function runDrill(scenario: DrillScenario, o: DrillRunOptions): Promise<DrillReport> {
  if ('standalone' in scenario) return scenario.standalone(o);
  const model = o.model
    ? await (await import('../model/llama/model-info.ts')).LlamaModelInfo.open({
        modelPath: o.model.path,
        sequences: o.model.sequences,
        contextSize: null,
        gpu: 'cpu',
      })
    : undefined;
  const stackOptions: StackOptions = {
    journalPath: o.journalPath,
    durability: 'power',
    log: o.log,
    version: o.version,
    engineLogLevel: 'warn',
    // journal-unwritable fills the journal's disk through its fault hooks.
    journalFaults: true,
    ...(model ? { model } : {}),
    ...scenario.stack,
    ...o.stack,
    engineArgs: drillEngineArgs(o, scenario.engineArgs),
  };
  const serving = await startServing({
    ...stackOptions,
    canaryIntervalMs: scenario.canaryIntervalMs ?? 1000,
    maxRoomsPerEngine: scenario.stack?.maxRoomsPerEngine ?? Math.max(64, o.clients * 2),
    api: { adminToken: null, canaryStaleMs: 5000 },
  });
  const { stack, canary } = serving;
  const log = o.log;
  let report: DrillReport;
  try {
    const base = await serving.listen('127.0.0.1', 0);
    const target = new LocalTarget(stack, base, canary, () => serving.ready());
    report = await drive(scenario, target, o);
  } catch (err) {
    await serving.close(0);
    throw err;
  }
  // The API closes now; the stack stays up for the full-restart baseline.
  await canary.stop();
  await serving.app.close();
  const note = (what: string) => {
    report.timeline.push({ atMs: Date.now() - report.startedAt, what });
    log.info({ drill: scenario.name }, what);
  };
  if (o.baseline !== false) report.fullRestartMs = await fullRestart(stack, stackOptions, note);
  else await stack.stop();
  const comparison = compareRecovery(report);
  if (comparison) {
    report.faster = comparison.faster;
    note(comparison.line);
  }
  return report;
}

/** Why `scenario` cannot run against the stack at `target`, or null when it can. */
export async function remoteBlocker(
  scenario: DrillScenario,
  target: DrillTarget,
): Promise<string | null> {
  const needs: RemoteNeeds = scenario.remote ?? {};
  if (needs.unsupported) return needs.unsupported;
  if (needs.signals && !target.sameHost)
    return `it signals engine processes, and ${target.base} is not on this host`;
  if (needs.faults) {
    const refusing = (await target.engines())
      .filter((e) => !e.faultInjection)
      .map((e) => e.id)
      .sort();
    if (refusing.length > 0)
      return `it injects faults, and ${refusing.join(', ')} refuse them: start the stack with \`pdctl serve --allow-fault-injection\``;
  }
  return null;
}

/**
 * Runs a drill against the running `pdctl serve` at `target` (`pdctl drill --url`). Nothing is
 * started and nothing restarted by the drill, so there is no full-restart baseline.
 */
export async function runRemoteDrill(
  scenario: DrillScenario,
  target: RemoteTarget,
  o: Pick<DrillRunOptions, 'clients' | 'log' | 'strictTargets'>,
): Promise<DrillReport> {
  const blocker = await remoteBlocker(scenario, target);
  if (blocker !== null || 'standalone' in scenario)
    throw new TargetError(`drill ${scenario.name} cannot run against ${target.base}: ${blocker}`);
  return drive(scenario, target, { ...o, journalPath: target.journalPath });
}

/** The drill itself, on either target: load, the scenario's fault and checks, the common ones. */
async function drive(
  scenario: StackScenario,
  target: DrillTarget,
  o: Pick<DrillRunOptions, 'clients' | 'log' | 'strictTargets' | 'journalPath'>,
): Promise<DrillReport> {
  const engines = await target.engines();
  const idsOf = (role: string) =>
    engines
      .filter((e) => e.role === role)
      .map((e) => e.id)
      .sort();
  const started = Date.now();
  const log = o.log;
  const rec = new DrillRecorder(started, (what) => log.info({ drill: scenario.name }, what));
  const { mark, check, timeline, invariants } = rec;
  const samples: StateSample[] = [];
  const loads: Load[] = [];
  const states = new Map<string, string>();
  const terminal = { completed: 0, aborted: 0, failed: 0, migrated: 0 };
  const unwatch = target.watchRooms((room, _from, to) => {
    if (isTerminal(to)) {
      states.delete(room);
      terminal[to as keyof typeof terminal]++;
    } else states.set(room, to);
  });
  const sampler = setInterval(() => {
    const live: Record<string, number> = {};
    for (const s of states.values()) live[s] = (live[s] ?? 0) + 1;
    // Requests the clients have out with no live room: waiting for an engine (one restarting)
    // or for their first room. Without them the chart fell to 0 while every client waited.
    const out = loads.reduce((n, l) => n + l.inFlight, 0);
    if (out > states.size) live.waiting = out - states.size;
    samples.push({ atMs: Date.now() - started, live, terminal: { ...terminal } });
  }, 100);
  const excused: Array<{ from: number; to: number; why: string }> = [];
  let inPlace: InPlace | null = null;
  const ctx: DrillContext = {
    target,
    local: target instanceof LocalTarget ? target : null,
    engineIds: { prefill: idsOf('prefill'), decode: idsOf('decode') },
    base: target.base,
    log,
    clients: o.clients,
    mark,
    check,
    load: (lo = {}) => {
      const l = new Load({
        base: target.base,
        model: target.model,
        clients: o.clients,
        maxTokens: 48,
        ...lo,
      });
      loads.push(l.start());
      return l;
    },
    waitReady: async (want, timeoutMs) => {
      const t0 = Date.now();
      const held = await until(async () => (await target.ready()) === want, timeoutMs);
      return held ? Date.now() - t0 : Number.NaN;
    },
    sleep,
    excuse: (from, to, why) => excused.push({ from, to, why }),
    recoveredInPlace: (figures) => {
      inPlace = figures;
    },
  };
  try {
    await target.record('drill.started', { scenario: scenario.name, clients: o.clients });
    mark(
      `${target.kind === 'local' ? 'stack up' : `stack at ${target.base}`}: ${ctx.engineIds.prefill.length} prefill, ${ctx.engineIds.decode.length} decode`,
    );
    await scenario.run(ctx);
    for (const l of loads) await l.stop();
    await commonInvariants(ctx, started, loads, excused);
  } catch (err) {
    rec.crashed(err);
  } finally {
    clearInterval(sampler);
    unwatch();
    for (const l of loads) await l.stop(0);
    // A drill that stopped early must not leave a fault behind (KV corruption on a running stack).
    const missed = await target.clearFaults();
    if (missed.length > 0)
      log.error(
        { engines: missed },
        'could not clear the faults this drill injected: send inject_fault none to them by hand',
      );
  }
  const passed = drillPassed(invariants, o.strictTargets);
  const { ended, leftBehind } = await afterwards(target, started).catch((err) => {
    log.error({ err }, 'could not read what the drill left');
    return { ended: [], leftBehind: [] };
  });
  await target
    .record('drill.finished', {
      scenario: scenario.name,
      passed,
      invariants: invariants.map((i) => ({ name: i.name, ok: i.ok, figure: i.figure })),
    })
    .catch((err) => log.error({ err }, 'could not journal drill.finished'));
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
    fullRestartMs: null,
    inPlace,
    faster: null,
    url: target.kind === 'remote' ? target.base : null,
    ended,
    leftBehind,
  };
}

/** The clients' rooms that did not complete since `started`, and the engines left out of rotation. */
async function afterwards(
  target: DrillTarget,
  started: number,
): Promise<Pick<DrillReport, 'ended' | 'leftBehind'>> {
  const mine = (room: string | null): room is string => room !== null && !target.isCanaryRoom(room);
  const ended: DrillReport['ended'] = [];
  for (const e of await target.events('room.failed', started))
    if (mine(e.room))
      ended.push({ room: e.room, state: 'failed', why: `${e.data.reason} in ${e.data.stage}` });
  for (const e of await target.events('room.migrated', started))
    if (mine(e.room))
      ended.push({
        room: e.room,
        state: 'migrated',
        why: `to ${e.data.toRoom}: ${e.data.reason ?? e.data.detail ?? ''}`,
      });
  for (const e of await target.events('room.aborted', started))
    if (mine(e.room)) ended.push({ room: e.room, state: 'aborted', why: e.data.reason });
  const leftBehind = (await target.engines()).flatMap((e) =>
    e.outOfRotation ? [{ engine: e.id, ...e.outOfRotation }] : [],
  );
  return { ended, leftBehind };
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
export async function commonInvariants(
  ctx: Pick<DrillContext, 'target' | 'check' | 'mark' | 'sleep'>,
  started: number,
  loads: Load[],
  excused: Array<{ from: number; to: number; why: string }>,
): Promise<void> {
  const { target, check } = ctx;
  // Every room of the drill terminal, and none overstayed a state's deadline by more than the
  // watchdog's reaction time. (Against a running stack, other clients' rooms count too: a room
  // of theirs still live after 15 s is reported, not excused.)
  const settleBy = Date.now() + 15_000;
  let roomIds = await target.roomsSince(started);
  let timelines = await Promise.all(roomIds.map((r) => target.timeline(r)));
  const unsettled = () => timelines.some((t) => !t.room || !isTerminal(t.room.state));
  while (Date.now() < settleBy && unsettled()) {
    await ctx.sleep(100);
    roomIds = await target.roomsSince(started);
    timelines = await Promise.all(roomIds.map((r) => target.timeline(r)));
  }
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

  check(reservationsCheck(timelines));

  const records = loads.flatMap((l) => l.records);
  const completed = records.filter((r) => r.outcome === 'completed');
  check(answersCheck(records, target.model));
  // Acknowledged work is in the journal: every request answered in full has its room completed.
  // A migrated or retried request's journal record is its chain of rooms: each migrated to the
  // next (`room.migrated.toRoom`) or failed before its first token and tried again
  // (`recovery.action` `retry_room`, `toRoom`), the last completed.
  const missing: string[] = [];
  let migrated = 0;
  let retried = 0;
  for (const r of completed) {
    let t = r.room ? await target.timeline(r.room) : null;
    for (let hops = 0; t?.room && hops < 10; hops++) {
      const retry = t.events.find(
        (e) => e.type === 'recovery.action' && e.data.action === 'retry_room',
      );
      const next =
        t.room.state === 'migrated'
          ? t.room.migratedTo
          : t.room.state === 'failed'
            ? ((retry?.data as { toRoom?: string } | undefined)?.toRoom ?? null)
            : null;
      if (!next) break;
      if (t.room.state === 'migrated') migrated++;
      else retried++;
      t = await target.timeline(next);
    }
    if (t?.room?.state !== 'completed') missing.push(r.room ?? '(no room id)');
  }
  check({
    name: 'no answered request missing from the journal',
    ok: missing.length === 0,
    figure: {
      answered: completed.length,
      missing: missing.length,
      migrations: migrated,
      retries: retried,
    },
    detail:
      missing.length === 0
        ? 'each has its room (or the last of its migrated or retried rooms) completed'
        : missing.slice(0, 5).join(', '),
  });

  check(await noLeakedPages(target, 'free = capacity on every engine'));
  const verify = await target.verify();
  check(
    typeof verify === 'string'
      ? {
          name: 'journal verify passes',
          ok: false,
          figure: {},
          detail: `not run: ${verify}`,
          skipped: true,
        }
      : {
          name: 'journal verify passes',
          ok: verify.ok,
          figure: { events: verify.events },
          detail: verify.ok ? 'projection equals the fold' : verify.problems.slice(0, 3).join('; '),
        },
  );
  const next = await target.canary(2000);
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

/**
 * Protocol 7's path, judged from the journal: no decode engine refused the pages the control plane
 * reserved (`kv_reservation_refused` is a defect: the page map and a pool disagreed), and the
 * hidden cost of speculation — first tokens a decode engine computed on the `kv_arrived` hint and
 * threw away because the room ended before its transfer committed — per 1,000 rooms.
 */
function reservationsCheck(
  timelines: ReadonlyArray<Awaited<ReturnType<DrillTarget['timeline']>>>,
): Invariant {
  const rooms = timelines.filter((t) => t.room);
  const refused = rooms.filter((t) => t.room?.reason === 'kv_reservation_refused');
  let wasted = 0;
  for (const t of rooms)
    for (const e of t.events)
      if (e.type === 'room.released') wasted += Number(e.data.speculativeTokens ?? 0);
  const per1000 = rooms.length === 0 ? 0 : Number(((wasted / rooms.length) * 1000).toFixed(1));
  return {
    name: 'every decode reservation claimed',
    ok: refused.length === 0,
    figure: { rooms: rooms.length, refused: refused.length, wastedFirstTokensPer1000: per1000 },
    detail:
      refused.length === 0
        ? `no room failed kv_reservation_refused; ${wasted} first tokens computed on a hint and thrown away`
        : `rooms ${refused
            .map((t) => t.room?.room)
            .slice(0, 5)
            .join(
              ', ',
            )} failed kv_reservation_refused: the page map and a decode pool disagreed (see that engine's error log)`,
  };
}

/** Which of `ids` kept their process — the same pid and incarnation — from `before` to `after`. */
export function keptProcesses(
  before: readonly EngineView[],
  after: readonly EngineView[],
  ids: readonly string[],
): string[] {
  return ids.filter((id) => {
    const a = before.find((e) => e.id === id);
    const b = after.find((e) => e.id === id);
    return a !== undefined && b !== undefined && a.pid === b.pid && a.incarnation === b.incarnation;
  });
}

/** The `zero leaked pages` invariant: every engine's pool full again within 10 s. */
export async function noLeakedPages(target: DrillTarget, detail: string): Promise<Invariant> {
  const leaked = await leakedPages(target, 10_000);
  return {
    name: 'zero leaked pages',
    ok: leaked === 0,
    figure: { pages: Number.isNaN(leaked) ? 'unknown' : leaked },
    detail,
  };
}

/**
 * Pages not free across all engines, from heartbeats sent after now; NaN if none came in time.
 * A room of another client (under `--url`) holds pages too: the check waits for them to end.
 */
async function leakedPages(target: DrillTarget, timeoutMs: number): Promise<number> {
  const since = Date.now();
  let leaked = Number.NaN;
  while (Date.now() - since < timeoutMs) {
    const engines = (await target.engines()).filter((e) => e.live);
    const elapsed = Date.now() - since;
    if (
      engines.length > 0 &&
      engines.every((e) => e.heartbeatAgeMs !== null && e.heartbeatAgeMs < elapsed)
    ) {
      leaked = engines.reduce((n, e) => n + (e.totalPages - (e.freePages ?? 0)), 0);
      if (leaked === 0) return 0;
    }
    await sleep(50);
  }
  return leaked;
}

/**
 * Every completed answer is right. The built-in model's text is compared with the model run
 * in-process. A llama.cpp model's text depends on which rooms share its batch (docs/model.md), so
 * it cannot be compared with a run alone: each answer must be whole instead — max_tokens tokens,
 * or ended by a stop.
 */
function answersCheck(records: RequestRecord[], model: string): Invariant {
  const completed = records.filter((r) => r.outcome === 'completed');
  if (model === DETERMINISTIC_MODEL_NAME) {
    const wrong = wrongAnswers(records, new DeterministicModel());
    return {
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
    };
  }
  const short = completed.filter((r) => r.tokens !== r.maxTokens && r.finishReason !== 'stop');
  return {
    name: 'every answer served is whole',
    ok: short.length === 0,
    figure: { completed: completed.length, short: short.length },
    detail:
      short.length === 0
        ? `each completed answer has its max_tokens tokens or ended at a stop (${model}: its text depends on the batch it ran in, so it is not compared with a run alone)`
        : `short answers in rooms ${short
            .map((r) => `${r.room} (${r.tokens} of ${r.maxTokens})`)
            .slice(0, 5)
            .join(', ')}`,
  };
}
