/** What every drill reports: each invariant checked, with the figure it measured. */

export interface Invariant {
  name: string;
  ok: boolean;
  /** The measured figure, with its unit in the name of the key (e.g. `{ ms: 412 }`). */
  figure: Record<string, number | string>;
  detail: string;
}

export interface DrillReport {
  scenario: string;
  passed: boolean;
  startedAt: number;
  ms: number;
  /** What the drill did and saw, in order, with times relative to its start. */
  timeline: Array<{ atMs: number; what: string }>;
  invariants: Invariant[];
}

export function renderReport(r: DrillReport): string {
  const lines = [`drill ${r.scenario}: ${r.passed ? 'PASSED' : 'FAILED'} in ${r.ms} ms`, ''];
  for (const t of r.timeline) lines.push(`  +${String(t.atMs).padStart(6)} ms  ${t.what}`);
  lines.push('');
  for (const i of r.invariants) {
    const figure = Object.entries(i.figure)
      .map(([k, v]) => `${k}=${v}`)
      .join(' ');
    lines.push(
      `  ${i.ok ? 'ok  ' : 'FAIL'}  ${i.name.padEnd(34)} ${figure.padEnd(24)} ${i.detail}`,
    );
  }
  return lines.join('\n');
}
