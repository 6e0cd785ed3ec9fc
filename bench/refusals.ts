/**
 * What keeping every refused request's id costs: a burst of refusals (a flood of 429s or 503s)
 * noted in the API's RefusalLog, which journals them 20 ids to a `request.refused` event, into a
 * SQLite journal (durability `power`, the default), against the baseline of the same journal
 * taking one raw append per refused request. Rounds alternate so the machine's drift hits both.
 * The figure is wall time and journal bytes per refused request, and its ratio to the baseline's.
 *
 *   npm run bench:refusals                        # a table
 *   npm run bench:refusals -- --requests 20000 --rounds 5 --json
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RefusalLog } from '../src/api/refusals.ts';
import { openJournal } from '../src/app/journal.ts';
import { silentLogger } from '../src/log.ts';
import { asJson, checkFlags, flag, say } from './args.ts';

const requests = Number(flag('--requests', '10000'));
const rounds = Number(flag('--rounds', '3'));
checkFlags();

interface Run {
  ms: number;
  bytes: number;
  events: number;
}

const refusal = (i: number) => ({
  reason: 'overloaded',
  status: 429,
  count: 1,
  requestIds: [`bench-${i.toString().padStart(8, '0')}`],
  message: 'no decode engine has the KV pages for this request now',
  firstAt: i,
  lastAt: i,
});

async function once(how: 'raw' | 'log'): Promise<Run> {
  const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-refusals-'));
  const journal = await openJournal({
    path: join(dir, 'journal.db'),
    durability: 'power',
    log: silentLogger,
  });
  try {
    const before = await journal.stats();
    const t0 = performance.now();
    if (how === 'raw') {
      const pending: Promise<unknown>[] = [];
      for (let i = 0; i < requests; i++)
        pending.push(journal.append({ type: 'request.refused', source: 'api', data: refusal(i) }));
      await Promise.all(pending);
    } else {
      const log = new RefusalLog((ev) => journal.append(ev), silentLogger);
      for (let i = 0; i < requests; i++)
        log.note('overloaded', 429, refusal(i).requestIds[0] as string, refusal(i).message);
      await log.close();
    }
    const ms = performance.now() - t0;
    const after = await journal.stats();
    return {
      ms,
      bytes: after.fileBytes - before.fileBytes,
      events: after.events - before.events,
    };
  } finally {
    await journal.drain();
    rmSync(dir, { recursive: true, force: true });
  }
}

const runs: Record<'raw' | 'log', Run[]> = { raw: [], log: [] };
for (let r = 0; r < rounds; r++) {
  for (const how of r % 2 === 0 ? (['raw', 'log'] as const) : (['log', 'raw'] as const)) {
    const run = await once(how);
    runs[how].push(run);
    say(`round ${r + 1}/${rounds} ${how}: ${run.ms.toFixed(0)} ms, ${run.events} events`);
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const row = (how: 'raw' | 'log') => ({
  usPerRequest: (median(runs[how].map((r) => r.ms)) * 1000) / requests,
  bytesPerRequest: median(runs[how].map((r) => r.bytes)) / requests,
  events: median(runs[how].map((r) => r.events)),
});
const raw = row('raw');
const log = row('log');
if (asJson) {
  process.stdout.write(`${JSON.stringify({ requests, rounds, raw, log })}\n`);
} else {
  const line = (name: string, x: typeof raw) =>
    `${name.padEnd(44)} ${x.usPerRequest.toFixed(1).padStart(8)} ${(x.usPerRequest / raw.usPerRequest).toFixed(2).padStart(6)} ${x.bytesPerRequest.toFixed(0).padStart(8)} ${(x.bytesPerRequest / raw.bytesPerRequest).toFixed(2).padStart(6)} ${String(x.events).padStart(7)}`;
  process.stdout.write(
    `${requests} refused requests, median of ${rounds} rounds (SQLite, durability power)\n` +
      `${'how they are journaled'.padEnd(44)} ${'µs/req'.padStart(8)} ${'×'.padStart(6)} ${'B/req'.padStart(8)} ${'×'.padStart(6)} ${'events'.padStart(7)}\n` +
      `${line('baseline: one raw append per refusal', raw)}\n` +
      `${line('RefusalLog: 20 ids per request.refused', log)}\n`,
  );
}
