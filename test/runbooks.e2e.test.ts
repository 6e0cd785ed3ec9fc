/**
 * Every alert's runbook in docs/alerts.md, walked as on-call walks it: against a stack left in
 * the state two of them page for (its only decode engine cordoned: PdctlEngineCordoned and
 * PdctlNoDecodeEngine), each `pdctl …` command it names is run with URL, ENGINE, ROOM and PATH
 * filled in, and each column it points at must be in what those commands printed. A runbook that
 * names a command, a flag or a column that does not exist fails here.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type Served, serve } from './helpers/serve.ts';
import { pdctl, ROOT } from './helpers/spawn.ts';
import { waitFor } from './helpers/stack.ts';

/** Upper-case words of a runbook that are not columns: placeholders, units, signals, acronyms. */
const NOT_COLUMNS = new Set(
  'URL ROOM ENGINE PATH NAME REQUEST_ID CPU KB SQL TTFT SIGKILL SIGSTOP SIGTERM OOM KV WAL JSON GPU UCX HTTP'.split(
    ' ',
  ),
);

interface Runbook {
  alert: string;
  text: string;
}

function runbooks(): Runbook[] {
  const doc = readFileSync(join(ROOT, 'docs/alerts.md'), 'utf8');
  const alerts = doc.slice(doc.indexOf('\n## Alerts'));
  return alerts
    .split('\n### ')
    .slice(1)
    .map((part) => {
      const end = part.search(/\n## /);
      const body = end < 0 ? part : part.slice(0, end);
      const nl = body.indexOf('\n');
      return { alert: body.slice(0, nl).trim(), text: body.slice(nl + 1) };
    });
}

/** The `pdctl …` spans of a runbook, one line each. */
function commandsOf(text: string): string[] {
  return [...text.matchAll(/`(pdctl [^`]*)`/g)].map((m) =>
    (m[1] as string).replace(/\s+/g, ' ').trim(),
  );
}

/** Column names a runbook points at: runs of upper-case words (`LAST RECOVERY`, `STATUS`). */
function columnsOf(text: string): string[] {
  const prose = text.replace(/`[^`]*`/g, ' ');
  return [...new Set([...prose.matchAll(/\b[A-Z][A-Z_]+(?: [A-Z][A-Z_]+)*\b/g)].map((m) => m[0]))]
    .flatMap((w) => (w.split(' ').every((x) => NOT_COLUMNS.has(x)) ? [] : [w]))
    .filter((w) => w.length > 1);
}

let s: Served;
let room = '';
let requestId = '';

beforeAll(async () => {
  // Slow decode steps, so that a stream can be aborted while it runs.
  s = await serve([
    '--canary-interval-ms',
    '500',
    '--decode-us-per-token',
    '5000',
    // A frozen engine is left as it is (below): the ladder would restart it.
    '--no-restart-stalled',
  ]);
  const res = await fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': 'runbook-walk-1' },
    body: JSON.stringify({ model: 'pdctl-deterministic-1', prompt: 'the river', max_tokens: 2 }),
  });
  expect(res.status).toBe(200);
  room = res.headers.get('x-pdctl-room') as string;
  await res.text();
  requestId = 'runbook-walk-1';
  // A room that ended early: the journal's counts have a reason to show (its REASON).
  const long = await fetch(`${s.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'pdctl-deterministic-1',
      prompt: 'a long answer',
      max_tokens: 2000,
      stream: true,
    }),
  });
  const aborted = await pdctl([
    'abort',
    long.headers.get('x-pdctl-room') as string,
    '--url',
    s.url,
  ]);
  expect(aborted.code, aborted.stderr).toBe(0);
  await long.text();
  // A room that failed: its decode engine frozen, the watchdog fails it at its deadline (5 s).
  const engines = (await (await fetch(`${s.url}/v1/engines`)).json()) as {
    engines: Array<{ id: string; pid: number }>;
  };
  const frozen = engines.engines.find((e) => e.id === 'decode-0')?.pid as number;
  process.kill(frozen, 'SIGSTOP');
  try {
    const stuck = await fetch(`${s.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'pdctl-deterministic-1', prompt: 'frozen', max_tokens: 2 }),
    });
    expect(stuck.status).toBeGreaterThanOrEqual(500);
  } finally {
    process.kill(frozen, 'SIGCONT');
  }
  // The state two alerts page for: the only decode engine cordoned.
  const cordon = await pdctl(['engines', 'cordon', 'decode-0', '--url', s.url]);
  expect(cordon.code, cordon.stderr).toBe(0);
  await waitFor('decode capacity gone', async () => {
    const metrics = await (await fetch(`${s.url}/metrics`)).text();
    return /pdctl_engines_ready\{role="decode"\} 0/.test(metrics);
  });
}, 60_000);

afterAll(async () => {
  await s?.stop();
});

describe('every runbook of docs/alerts.md, walked against a running stack', () => {
  const books = runbooks();

  it('finds the runbooks, one for each alert of deploy/prometheus', () => {
    const rules = readFileSync(join(ROOT, 'deploy/prometheus/alerts.yml'), 'utf8');
    const anchors = [...rules.matchAll(/alerts\.md#(\w+)/g)].map((m) => m[1]);
    const headings = books.map((b) => b.alert.toLowerCase());
    for (const a of anchors) expect(headings, `runbook for ${a}`).toContain(a);
    expect(books.length).toBeGreaterThan(20);
  });

  it('readiness names the cordoned engine among the reasons no decode engine takes rooms', async () => {
    const ready = (await (await fetch(`${s.url}/health/ready`)).json()) as {
      checks: Record<string, { ok: boolean; detail: string }>;
    };
    expect(ready.checks.decode_engines).toEqual({
      ok: false,
      detail: expect.stringMatching(
        /^0 taking rooms .*, 1 cordoned \(pdctl engines uncordon decode-0\)$/,
      ),
    });
  });

  for (const book of runbooks())
    it(`${book.alert}: its commands run, and the columns it names are there`, async () => {
      const printed: string[] = [];
      for (const command of commandsOf(book.text)) {
        const words = command.split(' ').slice(1);
        const runnable = /\b(URL|PATH|ENGINE|ROOM|REQUEST_ID)\b/.test(command);
        if (!runnable) {
          // A command named, not one to run as written: it exists, and so do its flags.
          const verbs = words.filter((w) => /^[a-z][a-z-]*$/.test(w) && !w.startsWith('-'));
          const help = await pdctl([...verbs.slice(0, 2), '--help']);
          expect(help.code, `${command}: ${help.stderr}`).toBe(0);
          for (const flag of words.filter((w) => w.startsWith('--')))
            expect(help.stdout, `${command}: ${flag}`).toContain(flag);
          continue;
        }
        const args = words.map((w) =>
          w
            .replace(/^URL(\/.*)?$/, `${s.url}$1`)
            .replace(/^PATH$/, `${s.dataDir}/journal.db`)
            .replace(/^ENGINE$/, 'decode-0')
            .replace(/^ROOM$/, room)
            .replace(/^REQUEST_ID$/, requestId),
        );
        const r = await pdctl(args, { env: { PDCTL_URL: '', PDCTL_JOURNAL: '' } });
        // 0, or 1: it ran and found a problem (`abort` of a room that already ended); never a
        // usage error (2), a journal it could not open (3), a server it could not reach (4).
        expect([0, 1], `${command} → ${args.join(' ')}: ${r.stderr}`).toContain(r.code);
        printed.push(r.stdout);
      }
      // The routes it has on-call curl answer (never 404).
      for (const m of book.text.matchAll(/`curl [^`]*URL(\/[^\s`]*)`/g)) {
        const res = await fetch(`${s.url}${m[1]}`);
        expect(res.status, `${book.alert}: GET ${m[1]}`).not.toBe(404);
        printed.push(await res.text());
      }
      for (const column of columnsOf(book.text))
        expect(
          printed.some((out) => out.includes(column)),
          `${book.alert} names ${column}, which no command of its runbook printed`,
        ).toBe(true);
    });
});
