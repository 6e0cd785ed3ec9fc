/**
 * `pdctl engines`: the engines a running `pdctl serve` sees now — role, status (the control plane's verdict), the state it reports, pid, incarnation,
 * heartbeat age, loop ticks, pages, rooms, and where each stands on the escalation ladder. The
 * live view is the control plane's (it is not in the journal), so this asks it over HTTP.
 */
import type { Command } from 'commander';
import { UsageError } from '../errors.ts';
import type { LadderView } from '../recovery/ladder.ts';
import { hostTag } from '../transfer/host.ts';
import { ucxBackend } from '../transfer/ucx.ts';
import { callServer, DEFAULT_URL, errorOf, UnreachableError } from './api-client.ts';
import { EXIT, note, print, printJson } from './context.ts';
import { ENGINE_ACTIONS, type EngineAction, engineAction } from './ops-commands.ts';
import { renderTable } from './table.ts';

interface EngineRow {
  id: string;
  role: string;
  status: string;
  state: string;
  pid: number;
  incarnation: string;
  heartbeatAgeMs: number;
  loopTicks: Record<string, number>;
  freePages: number | null;
  totalPages: number;
  liveRooms: number;
  recovery: LadderView | null;
  /** Times its process was started again, after a crash or by the ladder (null: not spawned here). */
  restarts?: number | null;
  faultInjection?: boolean;
  /** The CUDA device of its KV pages; null (or absent, from an older server): host memory. */
  kvDevice?: number | null;
  host?: string | null;
  hostTag?: string | null;
  kvUcx?: boolean;
  /** KV transfers it took part in since the control plane started, by transport. */
  transfers?: Record<string, number>;
  /** Why it is out of rotation as an outlier (absent from an older server). */
  ejection?: { reason: string; since: number; until: number; times: number } | null;
  /** Why it takes no new rooms until uncordoned (absent from an older server). */
  cordon?: { reason: string; by: string; evidence: string | null; at: number } | null;
}

export function registerEnginesCommand(program: Command): void {
  program
    .command('engines')
    .description(
      'The engines a running `pdctl serve` sees now: state, pid, heartbeat age, loop ticks, free pages, ' +
        'KV (host memory or cuda:N, +ucx when it receives over UCX), HOST (equal tags share shared memory), ' +
        'TRANSFERS (how its rooms’ KV moved: ucx:12 shm:3), rooms, ' +
        'the escalation ladder (ok, resetting, restarting, cordoned, gave_up) with its resets and last outcome, and RESTARTS: how often ' +
        'its process was started again (after a crash, or by the ladder).',
    )
    .argument(
      '[action]',
      `${Object.keys(ENGINE_ACTIONS).join(', ')} ENGINE (${Object.entries(ENGINE_ACTIONS)
        .map(([a, x]) => `${a}: ${x.does}`)
        .join('; ')})`,
    )
    .argument('[engine]', 'the engine id, with an action')
    .option('--url <url>', 'the pdctl serve to ask (env PDCTL_URL)', DEFAULT_URL)
    .option('--json', 'the engines (or the action sent) as JSON')
    .action(
      async (
        action: string | undefined,
        engine: string | undefined,
        o: { url: string; json?: boolean },
      ) => {
        if (action !== undefined) {
          if (!(action in ENGINE_ACTIONS))
            throw new UsageError(
              `unknown action "${action}": pdctl engines [${Object.keys(ENGINE_ACTIONS).join('|')} ENGINE]`,
            );
          if (engine === undefined)
            throw new UsageError(`pdctl engines ${action} needs an engine id (see pdctl engines)`);
          process.exitCode = await engineAction(action as EngineAction, engine, o);
          return;
        }
        let body: { engines: EngineRow[] };
        try {
          const r = await callServer<{ engines: EngineRow[] }>(o.url, '/v1/engines');
          if (r.status !== 200)
            throw new UnreachableError(`HTTP ${r.status}: ${errorOf(r.status, r.body)}`);
          body = r.body;
        } catch (err) {
          if (!(err instanceof UnreachableError)) throw err;
          note(`pdctl engines: ${err.message}`);
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
            // A cordoned engine heartbeats like any other, but takes no room.
            {
              header: 'STATUS',
              value: (e) =>
                [e.status, e.cordon ? 'cordoned' : null, e.ejection ? 'ejected' : null]
                  .filter(Boolean)
                  .join(','),
            },
            { header: 'STATE', value: (e) => e.state },
            { header: 'PID', value: (e) => e.pid, align: 'right' },
            { header: 'HEARTBEAT', value: (e) => `${e.heartbeatAgeMs}ms`, align: 'right' },
            { header: 'BUS TICKS', value: (e) => e.loopTicks.bus ?? null, align: 'right' },
            {
              header: 'FREE/PAGES',
              value: (e) => `${e.freePages ?? '?'}/${e.totalPages}`,
              align: 'right',
            },
            {
              header: 'KV',
              value: (e) =>
                (typeof e.kvDevice === 'number' ? `cuda:${e.kvDevice}` : 'host') +
                (e.kvUcx ? '+ucx' : ''),
            },
            // Engines with the same tag share shared memory; others move KV over UCX.
            {
              header: 'HOST',
              value: (e) => e.hostTag ?? (e.host ? hostTag(e.host) : '-'),
            },
            // How its rooms' KV moved: "ucx:12 shm:3" (either end of the transfer).
            {
              header: 'TRANSFERS',
              value: (e) =>
                Object.entries(e.transfers ?? {})
                  .sort(([, a], [, b]) => b - a)
                  .map(([t, n]) => `${t}:${n}`)
                  .join(' ') || '-',
            },
            { header: 'ROOMS', value: (e) => e.liveRooms, align: 'right' },
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
        if (body.engines.length > 0 && !body.engines.some((e) => e.kvUcx === true)) {
          const ucx = ucxBackend();
          note(
            `KV moves through shared memory only: no engine receives over UCX (pdctl serve's own engines use --kv-transport shm; UCX on this machine: ${ucx.available ? ucx.reason : `unavailable — ${ucx.reason}`})`,
          );
        }
        for (const e of body.engines.filter((x) => x.cordon))
          print(
            `\n${e.id} is cordoned by the ${e.cordon?.by} since ${new Date(e.cordon?.at ?? 0).toISOString()}: ${e.cordon?.reason}${e.cordon?.evidence ? ` — ${e.cordon.evidence}` : ''}. It takes no rooms until \`pdctl engines uncordon ${e.id}\``,
          );
        for (const e of body.engines.filter((x) => x.ejection))
          print(
            `\n${e.id} is ejected as an outlier (${e.ejection?.times}× so far): ${e.ejection?.reason}. It takes no rooms until a canary through it passes, tried from ${new Date(e.ejection?.until ?? 0).toISOString()}`,
          );
        const faulty = body.engines
          .filter((e) => e.faultInjection === true)
          .map((e) => e.id)
          .sort();
        if (faulty.length > 0)
          print(
            `\nfault injection is ON for ${faulty.join(', ')} (--allow-fault-injection): drills may stall, hang or corrupt them; never in production`,
          );
      },
    );
}
