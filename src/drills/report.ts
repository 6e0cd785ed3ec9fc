/** What every drill reports: each invariant checked, with the figure it measured. */

export interface Invariant {
  name: string;
  ok: boolean;
  /** The measured figure, with its unit in the name of the key (e.g. `{ ms: 412 }`). */
  figure: Record<string, number | string>;
  detail: string;
  /**
   * A timing target, not a correctness invariant: reported as met or missed,
   * and counted in `passed` only under `--strict-targets` — timings on a shared machine vary.
   */
  target?: boolean;
  /** Not run where the drill ran (e.g. `journal verify` on another host): shown, not counted. */
  skipped?: boolean;
}

/** How an invariant reads in a report: ok, FAIL, met, MISS or skip. */
export function verdictOf(i: Invariant): 'ok' | 'FAIL' | 'met' | 'MISS' | 'skip' {
  if (i.skipped) return 'skip';
  if (i.target) return i.ok ? 'met' : 'MISS';
  return i.ok ? 'ok' : 'FAIL';
}

/** Every timing target a drill reports, by name: what `pdctl drill --target NAME=MS` may hold. */
export const TIMING_TARGETS: readonly string[] = [
  'time to detect',
  'time to recover in place',
  'time to all terminal',
  'time from restart to ready',
  'SIGKILL: fault → standby ready',
  'SIGSTOP: fault → standby ready',
];

/** A timing target: met when `ms` (NaN: it never happened) is at most `targetMs`. */
export function timingTarget(
  name: string,
  ms: number,
  targetMs: number,
  detail: string,
): Invariant {
  if (!TIMING_TARGETS.includes(name))
    throw new Error(`timing target "${name}" is not in TIMING_TARGETS (drill --target names them)`);
  return {
    name,
    ok: !Number.isNaN(ms) && ms <= targetMs,
    figure: { ms: Number.isNaN(ms) ? 'never' : ms, targetMs },
    detail,
    target: true,
  };
}

/** What a drill records as it runs: its steps, in time order, and the invariants it checked. */
export class DrillRecorder {
  readonly timeline: DrillReport['timeline'] = [];
  readonly invariants: Invariant[] = [];

  constructor(
    readonly started: number,
    private readonly onMark: (what: string) => void = () => {},
  ) {}

  /** Notes a step, now or at `at` (unix ms, e.g. an event's time). */
  mark = (what: string, at = Date.now()): void => {
    this.timeline.push({ atMs: at - this.started, what });
    this.timeline.sort((a, b) => a.atMs - b.atMs);
    this.onMark(what);
  };

  check = (i: Invariant): void => {
    this.invariants.push(i);
  };

  /** The drill stopped on an error before its end: a failed invariant that says where. */
  crashed(err: unknown): void {
    this.check({
      name: 'the drill ran to its end',
      ok: false,
      figure: {},
      detail: (err as Error).message,
    });
  }
}

/**
 * The report with the timing targets named in `targets` held to those figures (ms) instead of the
 * drill's own (`pdctl drill --target`), and `passed` again as `strict` counts a miss.
 */
export function holdTargets(
  report: DrillReport,
  targets: ReadonlyMap<string, number>,
  strict: boolean,
): DrillReport {
  if (targets.size === 0) return report;
  const invariants = report.invariants.map((i) => {
    const to = i.target === true ? targets.get(i.name) : undefined;
    if (to === undefined) return i;
    const ms = typeof i.figure.ms === 'number' ? i.figure.ms : Number.NaN;
    return { ...i, ok: !Number.isNaN(ms) && ms <= to, figure: { ...i.figure, targetMs: to } };
  });
  return { ...report, invariants, passed: drillPassed(invariants, strict) };
}

/** Whether the drill passed: every invariant held (and, if `strict`, every target was met). */
export function drillPassed(invariants: Invariant[], strict = false): boolean {
  return invariants.every((i) => i.ok || i.skipped === true || (i.target === true && !strict));
}

/** Rooms by state at one moment of the drill, for the report's chart. */
export interface StateSample {
  atMs: number;
  /** Live rooms by state; `waiting`: requests the clients have out beyond them (no room yet). */
  live: Record<string, number>;
  /** Rooms that reached each terminal state since the drill began. */
  terminal: Record<string, number>;
}

export interface DrillReport {
  scenario: string;
  summary: string;
  passed: boolean;
  startedAt: number;
  ms: number;
  /** What the drill did and saw, in order, with times relative to its start. */
  timeline: Array<{ atMs: number; what: string }>;
  invariants: Invariant[];
  samples: StateSample[];
  /** The journal the drill ran on. */
  journal: string;
  /** A full-stack restart, stop to serving again, measured after the drill (null: not measured). */
  fullRestartMs: number | null;
  /** A stall the ladder ended in place (null: the drill had none). */
  inPlace: InPlace | null;
  /** Which brought serving back sooner: recovery in place after detection, or the full restart. */
  faster: 'in_place' | 'full_restart' | null;
  /** The stack drilled through its API (`--url`); null: one the drill started and stopped. */
  url: string | null;
  /** Clients' rooms that failed, moved to another pair or were aborted; null: not gathered. */
  ended: EndedRoom[] | null;
  /** Engines out of rotation when the drill ended, and what takes each back; null: not asked. */
  leftBehind: Array<{ engine: string; what: string; undo: string | null }> | null;
}

/** A room that did not complete: how it ended, and why. */
export interface EndedRoom {
  room: string;
  state: 'failed' | 'migrated' | 'aborted';
  why: string;
}

/**
 * What to run after a drill: the journal's rooms and events of its window, and the command that
 * takes back each engine it left out of rotation.
 */
export function nextCommands(r: DrillReport): string[] {
  const where = r.url !== null ? `--url ${r.url}` : `--journal ${r.journal}`;
  const since = new Date(r.startedAt).toISOString();
  return [
    `pdctl rooms ${where} --since ${since} --state failed,migrated,aborted`,
    `pdctl journal tail ${where} --since ${since} --type engine,recovery`,
    // A stack the drill started is gone, but a cordon is journaled: a serve on its journal
    // starts with the engine cordoned, and URL is that serve.
    ...(r.leftBehind ?? []).flatMap((e) =>
      e.undo === null ? [] : [`${e.undo} --url ${r.url ?? 'URL'}`],
    ),
  ];
}

/**
 * Requests that waited with no room (the chart's `waiting`), as numbers: the most at once, how
 * long in all some did, and the longest stretch; null when none waited.
 */
export function waitingFigures(
  samples: readonly StateSample[],
): { peak: number; ms: number; longest: { fromMs: number; toMs: number } } | null {
  let peak = 0;
  let ms = 0;
  let run: { fromMs: number; toMs: number } | null = null;
  let longest: { fromMs: number; toMs: number } | null = null;
  for (let i = 0; i < samples.length; i++) {
    const s = samples[i] as StateSample;
    const waiting = s.live.waiting ?? 0;
    const next = samples[i + 1]?.atMs ?? s.atMs;
    if (waiting > 0) {
      peak = Math.max(peak, waiting);
      ms += next - s.atMs;
      run = run ? { fromMs: run.fromMs, toMs: next } : { fromMs: s.atMs, toMs: next };
      if (!longest || run.toMs - run.fromMs > longest.toMs - longest.fromMs) longest = run;
    } else run = null;
  }
  return longest === null ? null : { peak, ms, longest };
}

export interface InPlace {
  /** Fault → `engine.stalled`. */
  detectMs: number;
  /** `engine.stalled` → `engine.recovered`: the in-place rung's own time. */
  recoverMs: number;
}

/**
 * In-place recovery against the full restart measured in the same run. Both are counted from
 * the decision to act (a restart needs the same detection first, and more: a model to load).
 */
export function compareRecovery(
  r: Pick<DrillReport, 'inPlace' | 'fullRestartMs'>,
): { faster: 'in_place' | 'full_restart'; line: string } | null {
  if (!r.inPlace || r.fullRestartMs === null) return null;
  const { detectMs, recoverMs } = r.inPlace;
  const faster = recoverMs <= r.fullRestartMs ? 'in_place' : 'full_restart';
  return {
    faster,
    line: `in place: detected ${detectMs} ms after the fault, serving again ${recoverMs} ms later; a full-stack restart took ${r.fullRestartMs} ms — ${faster === 'in_place' ? `in place was faster by ${r.fullRestartMs - recoverMs} ms, and lost no request` : `the full restart was faster by ${recoverMs - r.fullRestartMs} ms (and would fail every request in flight)`}`,
  };
}

export function renderReport(r: DrillReport): string {
  const lines = [`drill ${r.scenario}: ${r.passed ? 'PASSED' : 'FAILED'} in ${r.ms} ms`, ''];
  lines.splice(1, 0, r.summary);
  for (const t of r.timeline) lines.push(`  +${String(t.atMs).padStart(6)} ms  ${t.what}`);
  lines.push('');
  for (const e of r.leftBehind ?? [])
    lines.push(`  left: ${e.engine} ${e.what}${e.undo ? ` (${e.undo} takes it back)` : ''}`);
  if (r.leftBehind?.length) lines.push('');
  for (const i of r.invariants) {
    const figure = Object.entries(i.figure)
      .map(([k, v]) => `${k}=${v}`)
      .join(' ');
    lines.push(
      `  ${verdictOf(i).padEnd(4)}  ${i.name.padEnd(44)} ${figure.padEnd(24)} ${i.detail}`,
    );
  }
  return lines.join('\n');
}

/** One line per drill: the summary table `pdctl drill all` ends with. */
export function renderSummary(reports: DrillReport[]): string {
  const width = Math.max(21, ...reports.map((r) => r.scenario.length));
  const lines = [
    `${'drill'.padEnd(width)} result  invariants  targets  full restart  in place (detect + recover)`,
  ];
  for (const r of reports) {
    const inv = r.invariants.filter((i) => !i.target && !i.skipped);
    const tgt = r.invariants.filter((i) => i.target);
    const count = (xs: Invariant[]) => `${xs.filter((i) => i.ok).length}/${xs.length}`;
    lines.push(
      `${r.scenario.padEnd(width)} ${(r.passed ? 'PASSED' : 'FAILED').padEnd(7)} ${count(inv).padEnd(11)} ${count(tgt).padEnd(8)} ${(r.fullRestartMs === null ? '-' : `${r.fullRestartMs} ms`).padEnd(13)} ${r.inPlace ? `${r.inPlace.detectMs} + ${r.inPlace.recoverMs} ms${r.faster === 'in_place' ? ' (faster)' : r.faster === 'full_restart' ? ' (slower)' : ''}` : '-'}`.trimEnd(),
    );
  }
  return lines.join('\n');
}
