/** `pdctl plan --url`: the planner of a running serve, from `GET /v1/planner`. */
import { UsageError } from '../../errors.ts';
import type { Decision } from '../../planner/model.ts';
import { callServer, errorOf } from '../api-client.ts';
import { EXIT, print, printJson } from '../context.ts';
import { renderTable } from '../table.ts';
import { collapseIdle, columns } from './table.ts';

/** The planner of a running serve: `GET /v1/planner`. */
export async function servedPlan(url: string, json: boolean): Promise<number> {
  const r = await callServer<PlannerAnswer>(url, '/v1/planner');
  if (r.status === 404)
    throw new UsageError(
      `${url} runs no planner (started with --planner off, or a pdctl before it)`,
    );
  if (r.status !== 200) throw new UsageError(errorOf(r.status, r.body));
  if (json) {
    printJson(r.body);
    return EXIT.ok;
  }
  const { mode, intervalMs, config, last, recent } = r.body;
  print(
    `planner: ${mode}, every ${intervalMs / 1000} s; budget ${config.budget} engines; targets: TTFT p90 ≤ ${config.sloTtftMs} ms, ITL p90 ≤ ${config.sloItlMs} ms, utilisation ${config.utilisation}`,
  );
  print(
    last
      ? `now: ${last.fleet.prefill} prefill / ${last.fleet.decode} decode; proposes ${last.proposal.prefill} / ${last.proposal.decode} (${last.reason}); heads for ${last.target.prefill} / ${last.target.decode}`
      : `no decision yet: the first comes ${intervalMs / 1000} s after the start`,
  );
  if (recent.length === 0) return EXIT.ok;
  const rows = recent
    .map((e) => ({ ...e.data, window: { from: e.data.inputs.from, to: e.data.inputs.to } }))
    .reverse();
  print(renderTable(collapseIdle(rows), columns(false)));
  return EXIT.ok;
}

interface PlannerAnswer {
  mode: string;
  intervalMs: number;
  config: { budget: number; sloTtftMs: number; sloItlMs: number; utilisation: number };
  last: Decision | null;
  /** Newest first. */
  recent: Array<{ seq: number; ts: number; data: Omit<Decision, 'window'> }>;
}
