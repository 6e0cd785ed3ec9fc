/** The table `pdctl plan` prints: a row per decision, its inputs, the fleet, the step and why. */
import type { Decision } from '../../planner/model.ts';
import type { Distribution } from '../../planner/record.ts';
import { formatTs } from '../../time.ts';

/** A row per decision, except that a run of intervals with no traffic is one row. */
type Row = Decision & { idle?: number };

export function collapseIdle(decisions: Decision[]): Row[] {
  const rows: Row[] = [];
  for (const d of decisions) {
    const last = rows[rows.length - 1];
    if (d.reason === 'no_traffic' && last?.reason === 'no_traffic') {
      last.idle = (last.idle ?? 1) + 1;
      last.window = { from: last.window.from, to: d.window.to };
    } else rows.push({ ...d });
  }
  return rows;
}

const num = (v: number, digits = 1) => v.toFixed(digits);
const dist = (d: Distribution) => (d.count === 0 ? null : `${d.p50}/${d.p90}`);
const ms = (d: Distribution) =>
  d.count === 0 ? null : `${Math.round(d.p50 ?? 0)}/${Math.round(d.p90 ?? 0)}`;

/** ms from a trace's start as `+h:mm:ss`. */
function clockOf(ms: number): string {
  const s = Math.floor(ms / 1000);
  const two = (n: number) => String(n).padStart(2, '0');
  return `+${Math.floor(s / 3600)}:${two(Math.floor(s / 60) % 60)}:${two(s % 60)}`;
}

/** `offset`: the first column is the time from the trace's start, not a UTC time. */
export const columns = (offset: boolean) => [
  offset
    ? {
        header: 'from start',
        value: (d: Row) => clockOf(d.window.from),
        align: 'left' as const,
      }
    : { header: 'from (UTC)', value: (d: Row) => formatTs(d.window.from), align: 'left' as const },
  { header: 'rooms/s', value: (d: Row) => num(d.inputs.arrivalsPerS) },
  { header: 'prompt p50/p90', value: (d: Row) => dist(d.inputs.promptTokens) },
  { header: 'output p50/p90', value: (d: Row) => dist(d.inputs.outputTokens) },
  {
    header: 'load P/D',
    value: (d: Row) => `${num(d.inputs.load.prefill, 2)}/${num(d.inputs.load.decode, 2)}`,
  },
  { header: 'TTFT ms p50/p90', value: (d: Row) => ms(d.inputs.ttftMs) },
  { header: 'ITL ms p50/p90', value: (d: Row) => ms(d.inputs.itlMs) },
  { header: 'fleet P/D', value: (d: Row) => `${d.fleet.prefill}/${d.fleet.decode}` },
  { header: 'target P/D', value: (d: Row) => `${d.target.prefill}/${d.target.decode}` },
  { header: 'proposal P/D', value: (d: Row) => `${d.proposal.prefill}/${d.proposal.decode}` },
  {
    header: 'reason',
    value: (d: Row) =>
      d.idle !== undefined
        ? `no_traffic ×${d.idle}`
        : d.wanted
          ? `waiting (${d.wanted.step} ${d.wanted.intervals})`
          : d.reason,
    align: 'left' as const,
  },
];
