/** What every drill reports: each invariant checked, with the figure it measured. */

export interface Invariant {
  name: string;
  ok: boolean;
  /** The measured figure, with its unit in the name of the key (e.g. `{ ms: 412 }`). */
  figure: Record<string, number | string>;
  detail: string;
}

/** Rooms by state at one moment of the drill, for the report's chart. */
export interface StateSample {
  atMs: number;
  /** Live rooms by state. */
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
}

export function renderReport(r: DrillReport): string {
  const lines = [`drill ${r.scenario}: ${r.passed ? 'PASSED' : 'FAILED'} in ${r.ms} ms`, ''];
  lines.splice(1, 0, r.summary);
  for (const t of r.timeline) lines.push(`  +${String(t.atMs).padStart(6)} ms  ${t.what}`);
  if (r.fullRestartMs !== null)
    lines.push(`  baseline: a full-stack restart took ${r.fullRestartMs} ms to serve again`);
  lines.push('');
  for (const i of r.invariants) {
    const figure = Object.entries(i.figure)
      .map(([k, v]) => `${k}=${v}`)
      .join(' ');
    lines.push(
      `  ${i.ok ? 'ok  ' : 'FAIL'}  ${i.name.padEnd(44)} ${figure.padEnd(24)} ${i.detail}`,
    );
  }
  return lines.join('\n');
}

/** One line per drill: the README's table, and what `pdctl drill all` ends with. */
export function renderSummary(reports: DrillReport[]): string {
  const lines = ['drill                 result  invariants  full restart'];
  for (const r of reports) {
    const ok = r.invariants.filter((i) => i.ok).length;
    lines.push(
      `${r.scenario.padEnd(21)} ${(r.passed ? 'PASSED' : 'FAILED').padEnd(7)} ${`${ok}/${r.invariants.length}`.padEnd(11)} ${r.fullRestartMs === null ? '-' : `${r.fullRestartMs} ms`}`,
    );
  }
  return lines.join('\n');
}
