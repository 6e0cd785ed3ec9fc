/**
 * Operator actions on a running `pdctl serve`, over its admin API: `pdctl abort ROOM` and
 * `pdctl engines drain|undrain|reset|restart|cordon|uncordon ENGINE` (the listing is
 * engines-command.ts).
 */
import type { Command } from 'commander';
import { roomIdOf } from '../room/ids.ts';
import { callServer, DEFAULT_URL, errorOf, reaching } from './api-client.ts';
import { EXIT, note, print, printJson } from './context.ts';

/** What each engine action sends, and what it does. */
export const ENGINE_ACTIONS = {
  drain: {
    command: 'drain',
    does: 'takes no new rooms and finishes those it has (undrain takes it back)',
  },
  undrain: { command: 'undrain', does: 'takes new rooms again after a drain' },
  reset: {
    command: 'reset_in_place',
    does: 'resets its bus connection and transfer endpoint in place (the ladder’s first rung)',
  },
  restart: {
    command: 'shutdown',
    does: 'finishes its rooms and exits; pdctl serve (or the supervisor that runs it) starts it again',
  },
  // Not bus commands: the control plane's own (POST /v1/admin/engines/ENGINE/cordon|uncordon).
  cordon: {
    command: 'cordon',
    does: 'takes no new rooms, whatever incarnation registers, until uncordoned; the rooms it has finish there and its process is left alone, for inspection',
  },
  uncordon: { command: 'uncordon', does: 'takes new rooms again after a cordon' },
} as const;

export type EngineAction = keyof typeof ENGINE_ACTIONS;

export function registerAbortCommand(program: Command): void {
  program
    .command('abort')
    .description(
      'Abort a room, or every live room of a request (its x-request-id), on a running pdctl serve (journals ' +
        'room.abort_requested; each room ends aborted once both engines released it, and a client streaming it ' +
        'gets finish_reason "abort"). An id that names neither is refused and journals nothing. Needs ' +
        'PDCTL_ADMIN_TOKEN when the server has one.',
    )
    .argument('<id>', 'room id, the completion id a client got (cmpl-r-…), or a request id')
    .option('--reason <text>', 'journaled as the abort reason', 'operator')
    .option('--url <url>', 'the pdctl serve (env PDCTL_URL)', DEFAULT_URL)
    .option('--json', 'the answer as JSON')
    .action(async (given: string, o: { reason: string; url: string; json?: boolean }) => {
      const id = roomIdOf(given);
      process.exitCode = await reaching('abort', async () => {
        type Aborted = { room: string; seq: number; status: string };
        const r = await callServer<Aborted & { requestId?: string; rooms?: Aborted[] }>(
          o.url,
          `/v1/rooms/${encodeURIComponent(id)}/abort`,
          { method: 'POST', body: { reason: o.reason } },
        );
        if (r.status !== 202) {
          note(`pdctl abort: ${errorOf(r.status, r.body)}`);
          return EXIT.problem;
        }
        if (o.json) printJson(r.body);
        else if (r.body.rooms)
          print(
            `abort of request ${id} journaled for ${r.body.rooms.map((a) => `${a.room} (seq ${a.seq}, ${a.status})`).join(', ')}; each ends aborted once both engines release it — pdctl room ${id}`,
          );
        else
          print(
            `abort of ${id} journaled at seq ${r.body.seq} (${r.body.status}); it ends aborted once both engines release it — pdctl room ${id}`,
          );
        return EXIT.ok;
      });
    });
}

/** `pdctl engines drain|undrain|reset|restart|cordon|uncordon ENGINE`. */
export async function engineAction(
  action: EngineAction,
  engine: string,
  o: { url: string; json?: boolean },
): Promise<number> {
  const { command, does } = ENGINE_ACTIONS[action];
  const reason = `pdctl engines ${action}`;
  const own = command === 'cordon' || command === 'uncordon';
  return reaching(`engines ${action}`, async () => {
    const r = await callServer<{ engine: string; command: string }>(
      o.url,
      `/v1/admin/engines/${encodeURIComponent(engine)}/${own ? command : 'commands'}`,
      { method: 'POST', body: own ? { reason } : { command, reason } },
    );
    if (r.status !== 202) {
      note(`pdctl engines ${action}: ${errorOf(r.status, r.body)}`);
      return EXIT.problem;
    }
    if (o.json) printJson(r.body);
    else if (own) print(`${engine} ${command}ed: it ${does}; watch it with pdctl engines`);
    else print(`${command} sent to ${engine}: it ${does}; watch it with pdctl engines`);
    return EXIT.ok;
  });
}
