/**
 * What ships in deploy/: the Prometheus recording and alerting rules checked and unit-tested by
 * promtool, and every series the rules and the Grafana dashboard read found in /metrics of a
 * running stack that served some traffic — with the labels they select and group by. And the
 * alerts fire on series recorded from a real run: an engine killed three times, then the control
 * plane gone.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI from 'openai';
import parsePrometheus from 'parse-prometheus-text-format';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { startServing } from '../src/app/serving.ts';
import { silentLogger } from '../src/log.ts';
import { at, MetricsRecorder, promtoolOnRecorded } from './helpers/prom-record.ts';
import { type Served, serve } from './helpers/serve.ts';
import { ROOT } from './helpers/spawn.ts';
import { fillJournal, sqliteFaults } from './helpers/stack.ts';
import { tempDir } from './helpers/tmp.ts';
import { findTool, requireTool } from './helpers/tools.ts';
import { waitFor } from './helpers/wait.ts';

const PROM = join(ROOT, 'deploy/prometheus');
const promtool = findTool('promtool');
const hasPromtool = requireTool(
  'promtool',
  promtool,
  "Debian's prometheus package: apt-get install prometheus",
);

interface Rule {
  record?: string;
  alert?: string;
  expr: string;
  annotations?: Record<string, string>;
}
const rules = (file: string): Rule[] =>
  (
    parseYaml(readFileSync(join(PROM, file), 'utf8')) as { groups: Array<{ rules: Rule[] }> }
  ).groups.flatMap((g) => g.rules);

interface Panel {
  type: string;
  id: number;
  title: string;
  gridPos: { x: number; y: number; w: number; h: number };
  datasource?: { uid: string };
  targets?: Array<{ expr: string }>;
}
const dashboard = JSON.parse(readFileSync(join(ROOT, 'deploy/grafana/pdctl.json'), 'utf8')) as {
  uid: string;
  panels: Panel[];
  templating: { list: Array<{ name: string; query: string | { query: string } }> };
};
const panelExprs = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr));
const variableExprs = dashboard.templating.list.flatMap((v) =>
  typeof v.query === 'object' ? [v.query.query.replace(/^label_values\((.*), \w+\)$/, '$1')] : [],
);
/** Grafana's variables, replaced as Grafana would for a plain PromQL check. */
const asPromQL = (expr: string) =>
  expr
    .replace(/\$__rate_interval/g, '1m')
    .replace(/\$\{?(instance|engine)\}?/g, '.*')
    .replace(/\$\{?\w+\}?/g, 'x');

const allExprs = [
  ...rules('rules.yml').map((r) => r.expr),
  ...rules('alerts.yml').map((r) => r.expr),
  ...panelExprs.map(asPromQL),
  ...variableExprs.map(asPromQL),
];

/** pdctl series an expression reads (recorded series, which hold a colon, are not exported). */
function seriesIn(expr: string): string[] {
  return [...expr.matchAll(/(?<![\w:])pdctl_\w+/g)].map((m) => m[0]);
}

/** Label names an expression selects on (`name{label…}`) or groups by (`by`, `on`, …). */
function labelsIn(expr: string): string[] {
  const out: string[] = [];
  for (const m of expr.matchAll(/\{([^}]*)\}/g))
    for (const l of (m[1] as string).matchAll(/(\w+)\s*(=~|!~|!=|=)/g)) out.push(l[1] as string);
  for (const m of expr.matchAll(
    /\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)/g,
  ))
    for (const l of (m[1] as string).split(',')) if (l.trim()) out.push(l.trim());
  return out;
}

describe.runIf(hasPromtool)('promtool on deploy/prometheus', () => {
  const run = (...args: string[]) =>
    spawnSync(promtool as string, args, { cwd: PROM, encoding: 'utf8' });

  it('checks the recording and alerting rules', () => {
    const r = run('check', 'rules', 'rules.yml', 'alerts.yml');
    expect(r.status, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(/rules\.yml\s+SUCCESS: \d+ rules found/);
  });

  it("passes the alerts' unit tests (tests.yml)", () => {
    const r = run('test', 'rules', 'tests.yml');
    expect(r.status, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toMatch(/SUCCESS/);
  });

  it("parses every dashboard query as PromQL (as a recording rule, Grafana's variables filled)", () => {
    const dir = tempDir('pdctl-dashboard-');
    const file = join(dir, 'dashboard-queries.yml');
    const lines = ['groups:', '  - name: dashboard', '    rules:'];
    panelExprs.forEach((e, i) => {
      lines.push(
        `      - record: dashboard:query_${i}`,
        `        expr: ${JSON.stringify(asPromQL(e))}`,
      );
    });
    writeFileSync(file, `${lines.join('\n')}\n`);
    const r = spawnSync(promtool as string, ['check', 'rules', file], { encoding: 'utf8' });
    expect(r.status, r.stdout + r.stderr).toBe(0);
    expect(r.stdout).toContain(`SUCCESS: ${panelExprs.length} rules found`);
  });
});

describe('deploy/ as written', () => {
  it('has a runbook section in docs/alerts.md for every alert', () => {
    const docs = readFileSync(join(ROOT, 'docs/alerts.md'), 'utf8');
    const anchors = new Set(
      [...docs.matchAll(/^#+ (.+)$/gm)].map((m) =>
        (m[1] as string)
          .toLowerCase()
          .replace(/[^\w\- ]/g, '')
          .replace(/ /g, '-'),
      ),
    );
    const alerts = rules('alerts.yml');
    expect(alerts.length).toBeGreaterThan(10);
    for (const a of alerts) {
      // Absolute once Prometheus has the external label pdctl_runbook_base (deploy/README.md).
      const runbook = a.annotations?.runbook_url ?? '';
      expect(runbook, a.alert).toMatch(
        /^\{\{ \$externalLabels\.pdctl_runbook_base \}\}\/docs\/alerts\.md#/,
      );
      expect(anchors, `${a.alert}: ${runbook}`).toContain(runbook.split('#')[1]);
      expect(docs, `docs/alerts.md names ${a.alert}`).toContain(a.alert as string);
    }
  });

  it('lays the dashboard out on the grid, every panel on the data-source variable', () => {
    const ids = dashboard.panels.map((p) => p.id);
    expect(new Set(ids).size).toBe(ids.length);
    expect(dashboard.uid).toBe('pdctl');
    const names = dashboard.templating.list.map((v) => v.name);
    for (const p of dashboard.panels) {
      expect(p.gridPos.x + p.gridPos.w, p.title).toBeLessThanOrEqual(24);
      if (p.type === 'row') continue;
      // biome-ignore lint/suspicious/noTemplateCurlyInString: Grafana's variable syntax
      expect(p.datasource?.uid, p.title).toBe('${datasource}');
      expect(p.targets?.length, p.title).toBeGreaterThan(0);
      for (const t of p.targets ?? [])
        for (const v of t.expr.matchAll(/\$\{?(\w+)\}?/g))
          if (!(v[1] as string).startsWith('__')) expect(names, p.title).toContain(v[1]);
    }
    // No two panels overlap.
    const cells = new Set<string>();
    for (const p of dashboard.panels)
      for (let x = p.gridPos.x; x < p.gridPos.x + p.gridPos.w; x++)
        for (let y = p.gridPos.y; y < p.gridPos.y + p.gridPos.h; y++) {
          const cell = `${x},${y}`;
          expect(cells.has(cell), `${p.title} overlaps at ${cell}`).toBe(false);
          cells.add(cell);
        }
  });
});

describe('every series deploy/ reads, in /metrics of a running stack', () => {
  let s: Served;
  let metrics = '';

  beforeAll(async () => {
    // A canary every 200 ms and a planner decision every second, so that their series have samples too.
    s = await serve(['--canary-interval-ms', '200', '--planner-interval', '1s']);
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: 'unused', maxRetries: 0 });
    for (let i = 0; i < 3; i++) {
      const stream = await client.completions.create({
        model: 'pdctl-deterministic-1',
        prompt: `series ${i}`,
        max_tokens: 8,
        stream: true,
      });
      for await (const _ of stream);
    }
    await client.chat.completions.create({
      model: 'pdctl-deterministic-1',
      messages: [{ role: 'user', content: 'hello' }],
      max_tokens: 4,
    });
    await fetch(`${s.url}/v1/completions`, { method: 'POST', body: '{}' });
    // A canary passed, and both engines heartbeated (their pages and queues come from that).
    await waitFor(
      'a canary to pass, a planner decision and a heartbeat from each engine',
      async () => {
        const text = await (await fetch(`${s.url}/metrics`)).text();
        return (
          /pdctl_canary_runs_total\{outcome="ok"\} [1-9]/.test(text) &&
          /^pdctl_planner_desired_engines\{/m.test(text) &&
          (text.match(/^pdctl_engine_free_pages\{/gm) ?? []).length === 2
        );
      },
      15_000,
    );
    metrics = await (await fetch(`${s.url}/metrics`)).text();
  }, 60_000);

  afterAll(async () => {
    expect(await s.stop()).toBe(0);
  }, 30_000);

  it('finds each series, with samples, and the labels selected and grouped by', () => {
    const families = new Map(parsePrometheus(metrics).map((f) => [f.name, f]));
    /** A family's name as exported, from a series name (histograms export _bucket, _sum, _count). */
    const familyOf = (series: string) =>
      families.has(series) ? series : series.replace(/_(bucket|sum|count)$/, '');
    // Label names per family, from the sample lines themselves: the parser folds a histogram's
    // series into one sample and keeps none of their labels.
    const labelNames = new Map<string, Set<string>>();
    for (const m of metrics.matchAll(/^(\w+)\{([^}]*)\}/gm)) {
      const family = familyOf(m[1] as string);
      const set = labelNames.get(family) ?? new Set<string>();
      for (const l of (m[2] as string).matchAll(/(\w+)="/g)) set.add(l[1] as string);
      labelNames.set(family, set);
    }
    const labelsOf = (family: string) => labelNames.get(family) ?? new Set<string>();
    // Healthy, no series is expected to be empty but these: they have samples only in trouble.
    const onlyInTrouble = new Set([
      'pdctl_engine_stalled',
      'pdctl_engine_cordoned',
      'pdctl_engine_ejected',
      'pdctl_bus_dropped_frames_total',
    ]);
    const read = new Set<string>();
    for (const expr of allExprs) {
      const mine = seriesIn(expr).map(familyOf);
      const labels = new Set(['job', 'instance', 'le', ...mine.flatMap((f) => [...labelsOf(f)])]);
      for (const f of mine) {
        read.add(f);
        expect(families.has(f), `${f} (in ${expr}) is not in /metrics`).toBe(true);
        if (!onlyInTrouble.has(f))
          expect(families.get(f)?.metrics.length, `${f} has no samples`).toBeGreaterThan(0);
      }
      for (const l of labelsIn(expr))
        expect(
          labels.has(l) || mine.some((f) => onlyInTrouble.has(f)),
          `label ${l} in ${expr}`,
        ).toBe(true);
    }
    // The dashboard and rules between them read most of what pdctl exports.
    const exported = [...families.keys()].filter((n) => !/^pdctl_(process|nodejs)_/.test(n));
    const unread = exported.filter((n) => !read.has(n));
    expect(unread, 'series exported but on no dashboard panel or rule').toEqual([]);
  });
});

describe.runIf(hasPromtool)('alerts on series recorded from a real run', () => {
  it('an engine killed three times raises PdctlEngineRestartLoop; no decode capacity, PdctlNoDecodeEngine and PdctlCanaryFailing; a full journal disk, PdctlJournalNotWritable; a stopped control plane, PdctlControlPlaneDown', async () => {
    // The serving stack of `pdctl serve`, in this process so that its journal's disk can fill.
    const serving = await startServing({
      journalPath: join(tempDir('pdctl-recorded-'), 'journal.db'),
      durability: 'process',
      log: silentLogger,
      version: 'test',
      canaryIntervalMs: 150,
      // Its journal's disk fills through the fault hooks.
      journalFaults: true,
    });
    const url = await serving.listen('127.0.0.1', 0);
    const { engines, journal } = serving.stack;
    const rec = new MetricsRecorder(url);
    const marks = { afterKills: 0, drained: 0, full: 0 };
    let recording = true;
    // Each scrape is a 15 s step to promtool: while an engine restarts (seconds, more on a loaded
    // machine) none is taken, so the kills stay within the alert's 15-minute window of steps.
    let paused = false;
    const recorder = (async () => {
      while (recording) {
        if (!paused) await rec.scrape();
        await new Promise((r) => setTimeout(r, 150));
      }
    })();
    const scrapes = async (n: number, what: string) => {
      const from = rec.scrapes.length;
      await waitFor(what, () => rec.scrapes.length >= from + n, 60_000);
      return rec.scrapes.length - 1;
    };
    try {
      await waitFor('three scrapes', () => rec.scrapes.length >= 3);
      for (let kill = 0; kill < 3; kill++) {
        const before = engines.pid('decode-0');
        paused = true;
        expect(engines.signal('decode-0', 'SIGKILL')).toBe(true);
        await waitFor(
          `decode-0 back after kill ${kill + 1}`,
          () => {
            const s = serving.stack.control.registry.get('decode-0');
            return s?.pid !== before && s?.health.heartbeat?.state === 'ready';
          },
          20_000,
        );
        paused = false;
      }
      marks.afterKills = await scrapes(2, 'two scrapes after the last restart');
      // No decode capacity: decode-0 drains, every canary is refused. 36 scrapes: 9 minutes.
      const drained = await fetch(`${url}/v1/admin/engines/decode-0/commands`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ command: 'drain', reason: 'test: no decode capacity' }),
      });
      expect(drained.status).toBe(202);
      marks.drained = await scrapes(36, '36 scrapes drained');
      // The journal's disk is full: every commit fails.
      await fillJournal(journal);
      marks.full = await scrapes(6, 'six scrapes with the journal full');
      await sqliteFaults(journal).limitPages(null);
    } finally {
      await serving.close(0);
    }
    await scrapes(8, 'eight failed scrapes');
    recording = false;
    await recorder;

    // Counters exist at 0 from the first scrape; labels carry codes, never free text.
    const first = rec.scrapes.findIndex((x) => x !== null);
    for (const series of [
      'pdctl_engine_restarts_total{engine="decode-0",by="supervisor"}',
      'pdctl_engine_exits_total{engine="decode-0",cause="killed"}',
      'pdctl_http_responses_total{route="/v1/completions",status="503"}',
      'pdctl_rooms_ended_total{state="migrated",reason="engine_lost"}',
    ])
      expect(rec.value(first, series), series).toBe(0);
    const last = rec.lastAnswered();
    expect(rec.value(last, 'pdctl_engine_restarts_total{engine="decode-0",by="supervisor"}')).toBe(
      3,
    );
    expect(rec.value(last, 'pdctl_engine_exits_total{engine="decode-0",cause="killed"}')).toBe(3);
    for (const x of rec.scrapes)
      for (const key of x?.keys() ?? [])
        for (const [, name, value] of key.matchAll(/(reason|outcome|cause|status)="([^"]*)"/g))
          expect(value, `${name} in ${key}`).toMatch(/^[a-z0-9][a-z0-9_]*$/);

    // promtool: each scrape one 15 s step; at the last answered scrape the restart loop fires,
    // and once the control plane has not answered for over a minute, PdctlControlPlaneDown.
    const instance = 'recorded:8080';
    const r = promtoolOnRecorded(promtool as string, rec.inputSeries('pdctl', instance), [
      {
        eval_time: at(first),
        alertname: 'PdctlEngineRestartLoop',
        exp_alerts: [],
      },
      {
        eval_time: at(marks.afterKills),
        alertname: 'PdctlEngineRestartLoop',
        exp_alerts: [
          {
            exp_labels: { severity: 'warning', job: 'pdctl', instance, engine: 'decode-0' },
            exp_annotations: {
              summary: `decode-0 on ${instance}: started again 3 or more times in 15 minutes`,
              runbook_url: '/docs/alerts.md#pdctlenginerestartloop',
            },
          },
        ],
      },
      { eval_time: at(marks.afterKills), alertname: 'PdctlNoDecodeEngine', exp_alerts: [] },
      { eval_time: at(marks.afterKills), alertname: 'PdctlCanaryFailing', exp_alerts: [] },
      {
        eval_time: at(marks.drained),
        alertname: 'PdctlNoDecodeEngine',
        exp_alerts: [
          {
            exp_labels: { severity: 'critical', job: 'pdctl', instance, role: 'decode' },
            exp_annotations: {
              summary: `${instance}: no decode engine takes rooms (none heartbeats, or each drains or is cordoned)`,
              runbook_url: '/docs/alerts.md#pdctlnoengine',
            },
          },
        ],
      },
      {
        eval_time: at(marks.drained),
        alertname: 'PdctlCanaryFailing',
        exp_alerts: [
          {
            exp_labels: { severity: 'critical', job: 'pdctl', instance },
            exp_annotations: {
              summary: `${instance}: every health canary failed for 5 minutes`,
              runbook_url: '/docs/alerts.md#pdctlcanaryfailing',
            },
          },
        ],
      },
      {
        eval_time: at(marks.drained),
        alertname: 'PdctlJournalNotWritable',
        exp_alerts: [],
      },
      {
        eval_time: at(marks.full),
        alertname: 'PdctlJournalNotWritable',
        exp_alerts: [
          {
            exp_labels: { severity: 'critical', job: 'pdctl', instance },
            exp_annotations: {
              summary: `${instance}: the room journal refuses writes; new requests get 503`,
              runbook_url: '/docs/alerts.md#pdctljournalnotwritable',
            },
          },
        ],
      },
      { eval_time: at(last), alertname: 'PdctlControlPlaneDown', exp_alerts: [] },
      {
        eval_time: at(rec.scrapes.length - 1),
        alertname: 'PdctlControlPlaneDown',
        exp_alerts: [
          {
            exp_labels: { severity: 'critical', job: 'pdctl', instance },
            exp_annotations: {
              summary: `pdctl control plane ${instance} in job pdctl does not answer scrapes: no request is served there`,
              runbook_url: '/docs/alerts.md#pdctlcontrolplanedown',
            },
          },
        ],
      },
    ]);
    expect(r.status, r.output).toBe(0);
  }, 120_000);
});
