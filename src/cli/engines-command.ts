/**
 * `pdctl engines`: the engines a running `pdctl serve` sees now — role, state, pid, incarnation,
 * heartbeat age, loop ticks, pages, rooms, and where each stands on the escalation ladder. The
 * live view is the control plane's (it is not in the journal), so this asks it over HTTP.
 */
import type { Command } from 'commander';
import { UsageError } from '../errors.ts';
import type { LadderView } from '../recovery/ladder.ts';
import { EXIT, note, print, printJson } from './context.ts';
import { renderTable } from './table.ts';

interface EngineRow {
  id: string;
  role: string;
  state: string;
  pid: number;
  incarnation: string;
  heartbeat_age_ms: number;
  loop_ticks: Record<string, number>;
  free_pages: number | null;
  total_pages: number;
  live_rooms: number;
  recovery: LadderView | null;
  /** Times its process was started again, after a crash or by the ladder (null: not spawned here). */
  restarts?: number | null;
  fault_injection?: boolean;
  /** The CUDA device of its KV pages; null (or absent, from an older server): host memory. */
  kv_device?: number | null;
}

export function registerEnginesCommand(program: Command): void {
  program
    .command('engines')
    .description(
      'The engines a running `pdctl serve` sees now: state, pid, heartbeat age, loop ticks, free pages, rooms, ' +
        'the escalation ladder (ok, resetting, restarting, gave_up) with its resets and last outcome, and RESTARTS: how often ' +
        'its process was started again (after a crash, or by the ladder).',
    )
    .option(
      '--url <url>',
      'the pdctl serve to ask (env PDCTL_URL)',
      process.env.PDCTL_URL ?? 'http://127.0.0.1:8080',
    )
    .option('--json', 'the engines as JSON')
    .action(async (o: { url: string; json?: boolean }) => {
      let url: URL;
      try {
        url = new URL('/v1/engines', o.url);
      } catch {
        throw new UsageError(
          `--url must be an http(s) URL like http://127.0.0.1:8080, got "${o.url}"`,
        );
      }
      let body: { engines: EngineRow[] };
      try {
        const res = await fetch(url, { signal: AbortSignal.timeout(5000) });
        if (!res.ok) throw new Error(`HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`);
        body = (await res.json()) as { engines: EngineRow[] };
      } catch (err) {
        const e = err as Error & { cause?: { code?: string; message?: string } };
        const cause = e.cause?.code ?? e.cause?.message;
        const why = cause ? `${e.message} (${cause})` : e.message;
        note(
          `pdctl engines: cannot read ${url}: ${why}. Is pdctl serve running there? Pass --url.`,
        );
        process.exitCode = EXIT.unreachable;
        return;
      }
      if (o.json) {
        printJson(body.engines);
        return;
      }
      if (body.engines.length === 0) {
        print('no engines registered');
        return;
      }
      print(
        renderTable(body.engines, [
          { header: 'ENGINE', value: (e) => e.id },
          { header: 'ROLE', value: (e) => e.role },
          { header: 'STATE', value: (e) => e.state },
          { header: 'PID', value: (e) => e.pid, align: 'right' },
          { header: 'HEARTBEAT', value: (e) => `${e.heartbeat_age_ms}ms`, align: 'right' },
          { header: 'BUS TICKS', value: (e) => e.loop_ticks.bus ?? null, align: 'right' },
          {
            header: 'FREE/PAGES',
            value: (e) => `${e.free_pages ?? '?'}/${e.total_pages}`,
            align: 'right',
          },
          {
            header: 'KV',
            value: (e) => (typeof e.kv_device === 'number' ? `cuda:${e.kv_device}` : 'host'),
          },
          { header: 'ROOMS', value: (e) => e.live_rooms, align: 'right' },
          { header: 'LADDER', value: (e) => e.recovery?.phase ?? '-' },
          {
            header: 'RESETS',
            value: (e) => e.recovery?.resets ?? null,
            align: 'right',
          },
          {
            header: 'RESTARTS',
            value: (e) => e.restarts ?? e.recovery?.restarts ?? null,
            align: 'right',
          },
          {
            header: 'LAST RECOVERY',
            value: (e) => e.recovery?.reason ?? e.recovery?.lastOutcome ?? null,
          },
        ]),
      );
      const faulty = body.engines
        .filter((e) => e.fault_injection === true)
        .map((e) => e.id)
        .sort();
      if (faulty.length > 0)
        print(
          `\nfault injection is ON for ${faulty.join(', ')} (--allow-fault-injection): drills may stall, hang or corrupt them; never in production`,
        );
    });
}
