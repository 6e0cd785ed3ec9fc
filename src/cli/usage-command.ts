/**
 * `pdctl usage`: what each tenant used, from the journal — requests answered, refused and failed,
 * prompt and completion tokens, time waited in the queue. Reads a journal file, an archive, or a
 * running server's `GET /v1/usage`; the same figures either way (src/tenants/usage.ts).
 */
import type { Command } from 'commander';
import { UsageError } from '../errors.ts';
import { DEFAULT_USAGE_WINDOW_MS, type TenantUsage, usageOf } from '../journal/usage.ts';
import { formatDuration, formatTs, parseTime } from '../time.ts';
import { callServer, errorOf, READ_URL_HELP, reaching, readTarget } from './api-client.ts';
import {
  ARCHIVE_HELP,
  type CommonOptions,
  EXIT,
  note,
  openReader,
  print,
  printJson,
} from './context.ts';
import { renderTable } from './table.ts';

interface UsageOptions extends CommonOptions {
  url?: string;
  since: string;
  until?: string;
  tenant?: string;
}

interface Usage {
  since: number;
  until: number;
  tenants: TenantUsage[];
}

async function usageCommand(o: UsageOptions, cmd: Command): Promise<number> {
  const now = Date.now();
  const since = parseTime(o.since, now);
  const until = o.until === undefined ? now : parseTime(o.until, now);
  if (until < since)
    throw new UsageError(`--until ${o.until} is before --since ${o.since}: nothing lies between`);
  const target = readTarget(o, cmd);
  let usage: Usage;
  if ('url' in target) {
    const q = new URLSearchParams({ since: String(since), until: String(until) });
    if (o.tenant !== undefined) q.set('tenant', o.tenant);
    const r = await callServer<Usage>(target.url, `/v1/usage?${q}`);
    if (r.status !== 200) {
      note(`pdctl usage: ${errorOf(r.status, r.body)}`);
      return EXIT.problem;
    }
    usage = r.body;
  } else {
    const reader = openReader(o, since);
    try {
      const tenants = await usageOf(reader, {
        since,
        until,
        ...(o.tenant === undefined ? {} : { tenant: o.tenant }),
      });
      usage = { since, until, tenants };
    } finally {
      reader.close();
    }
  }
  if (o.json) {
    printJson(usage);
    return EXIT.ok;
  }
  print(`usage from ${formatTs(usage.since)} to ${formatTs(usage.until)}`);
  if (usage.tenants.length === 0) {
    print('no requests answered, refused or failed in that window');
    return EXIT.ok;
  }
  print(
    renderTable(usage.tenants, [
      { header: 'TENANT', value: (u) => u.tenant ?? '(no key)' },
      { header: 'ANSWERED', value: (u) => u.requests, align: 'right' },
      { header: 'REFUSED', value: (u) => u.refused, align: 'right' },
      { header: 'FAILED', value: (u) => u.failed, align: 'right' },
      { header: 'PROMPT TOKENS', value: (u) => u.promptTokens, align: 'right' },
      { header: 'COMPLETION TOKENS', value: (u) => u.completionTokens, align: 'right' },
      {
        header: 'WAITED',
        value: (u) => (u.waitedMs === 0 ? '0' : formatDuration(u.waitedMs)),
        align: 'right',
      },
    ]),
  );
  return EXIT.ok;
}

export function registerUsageCommand(
  program: Command,
  journalOption: (c: Command) => Command,
): void {
  journalOption(
    program
      .command('usage')
      .description(
        'what each tenant used, from the journal: requests answered, refused (429/503 before a room) and failed, ' +
          "prompt and completion tokens as its clients were told, time waited in flow control's queue",
      )
      .option('--since <time>', 'from this time (a request counts when its answer ended)', '24h')
      .option('--until <time>', 'up to this time (default: now)')
      .option('--tenant <name>', 'only this tenant')
      .addHelpText(
        'after',
        '\nTimes: ISO-8601 (2026-11-30T03:12:00Z), an age (10m, 2h, 7d), a UTC clock time (03:12), or unix ms.\n' +
          'Example: pdctl usage --since 7d --tenant acme --url http://10.0.0.5:8080\n' +
          `The route: GET /v1/usage?since=…&until=…&tenant=… (default: the last ${DEFAULT_USAGE_WINDOW_MS / 3600_000} hours); the SQL: docs/journal.md.`,
      ),
  )
    .option('--url <url>', READ_URL_HELP)
    .option('--archive <dir>', ARCHIVE_HELP)
    .action(async (o: UsageOptions, cmd: Command) => {
      process.exitCode = await reaching('usage', () => usageCommand(o, cmd));
    });
}
