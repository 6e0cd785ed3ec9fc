/** `pdctl journal stats`: counts by state and reason, and per-minute transitions. */

import { formatTs, parseTime } from '../../time.ts';
import { type CommonOptions, EXIT, openReader, print, printJson } from '../context.ts';
import { renderTable } from '../table.ts';

export interface StatsOptions extends CommonOptions {
  perMinute?: boolean;
  since?: string;
  until?: string;
}

export async function statsCommand(opts: StatsOptions): Promise<number> {
  const reader = openReader(opts);
  try {
    const s = await reader.stats();
    const now = Date.now();
    const window = opts.perMinute
      ? {
          since: opts.since ? parseTime(opts.since, now) : (s.lastTs ?? now) - 15 * 60_000,
          until: opts.until ? parseTime(opts.until, now) : (s.lastTs ?? now) + 1,
        }
      : null;
    const minutes = window ? await reader.perMinute(window) : null;
    if (opts.json) {
      printJson(minutes ? { ...s, perMinute: minutes } : s);
      return EXIT.ok;
    }
    print(
      `journal     ${s.path} (schema ${s.schemaVersion}, ${(s.fileBytes / 1048576).toFixed(1)} MiB)`,
    );
    print(
      `events      ${s.events}${s.firstSeq !== null ? `, seq ${s.firstSeq}..${s.lastSeq}` : ''}`,
    );
    print(`time span   ${formatTs(s.firstTs)} .. ${formatTs(s.lastTs)}`);
    print(`rooms       ${s.rooms}`);
    print(`rejected    ${s.rejectedEvents} events recorded as room.event_rejected`);
    const states = Object.entries(s.byState).sort((a, b) => b[1] - a[1]);
    if (states.length) {
      print('\nrooms by state');
      print(
        renderTable(states, [
          { header: 'STATE', value: (r) => r[0] },
          { header: 'ROOMS', value: (r) => r[1], align: 'right' },
        ]),
      );
    }
    for (const [title, table, unit] of [
      ['failures by reason', s.failuresByReason, 'ROOMS'],
      ['aborts by reason', s.abortsByReason, 'ROOMS'],
      ['requests refused before a room, by reason', s.refusalsByReason, 'REQUESTS'],
    ] as const) {
      const rows = Object.entries(table);
      if (!rows.length) continue;
      print(`\n${title}`);
      print(
        renderTable(rows, [
          { header: 'REASON', value: (r) => r[0] },
          { header: unit, value: (r) => r[1], align: 'right' },
        ]),
      );
    }
    if (s.consumers.length) {
      print('\nconsumers');
      print(
        renderTable(s.consumers, [
          { header: 'NAME', value: (c) => c.name },
          { header: 'SEQ', value: (c) => c.seq, align: 'right' },
          { header: 'UPDATED', value: (c) => formatTs(c.updatedAt) },
        ]),
      );
    }
    if (s.leaders?.length) {
      print('\nleaders (PostgreSQL)');
      print(
        renderTable(s.leaders, [
          { header: 'TERM', value: (l) => l.term, align: 'right' },
          { header: 'SINCE', value: (l) => formatTs(l.acquiredAt) },
          { header: 'HOW', value: (l) => l.how },
          { header: 'EVENTS', value: (l) => l.events, align: 'right' },
          { header: 'HOLDER', value: (l) => l.holder },
        ]),
      );
    }
    if (minutes && window) {
      print(`\nper minute, ${formatTs(window.since)} .. ${formatTs(window.until)}`);
      if (!minutes.length) print('no room transitions in this window');
      else
        print(
          renderTable(minutes, [
            { header: 'MINUTE', value: (m) => formatTs(m.minute).slice(0, 16) },
            { header: 'ENTERED', value: (m) => m.state },
            { header: 'REASON', value: (m) => m.reason },
            { header: 'COUNT', value: (m) => m.count, align: 'right' },
          ]),
        );
    }
    return EXIT.ok;
  } finally {
    reader.close();
  }
}
