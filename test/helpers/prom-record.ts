/**
 * Series recorded from a real run, for `promtool test rules`: each scrape of /metrics is one step
 * of a promtool test (`interval` apart in its time), a scrape that fails is `up` 0 with every pdctl
 * series missing (`_`) at that step — as Prometheus would have stored them.
 */

import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { stringify as toYaml } from 'yaml';
import { ROOT } from './spawn.ts';
import { tempDir } from './tmp.ts';

/** One scrape: series (name with its labels, in the exposition's text) → value; null: it failed. */
type Scrape = Map<string, number> | null;

export class MetricsRecorder {
  readonly scrapes: Scrape[] = [];

  /** `url`: where the target listens; a function answering null: not yet (a failed scrape). */
  constructor(private readonly url: string | (() => string | null)) {}

  async scrape(): Promise<void> {
    try {
      const base = typeof this.url === 'function' ? this.url() : this.url;
      if (base === null) throw new Error('not listening yet');
      const res = await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(2000) });
      if (res.status !== 200) throw new Error(`HTTP ${res.status}`);
      const samples = new Map<string, number>();
      for (const line of (await res.text()).split('\n')) {
        const m = /^(pdctl_\w+)(\{[^}]*\})? (\S+)$/.exec(line);
        // Histogram buckets and the process's own figures: not what alerts read, and many.
        if (!m || /_bucket$|^pdctl_(process|nodejs)_/.test(m[1] as string)) continue;
        const value = Number(m[3]);
        if (Number.isFinite(value)) samples.set(`${m[1]}${m[2] ?? '{}'}`, value);
      }
      this.scrapes.push(samples);
    } catch {
      this.scrapes.push(null);
    }
  }

  /** The value of one series at one scrape (`series` as exported, e.g. `pdctl_x{a="b"}`). */
  value(step: number, series: string): number | undefined {
    return this.scrapes[step]?.get(series);
  }

  /** The last scrape that answered. */
  lastAnswered(): number {
    return this.scrapes.findLastIndex((s) => s !== null);
  }

  /** promtool's `input_series`, every series labelled with `job` and `instance`. */
  inputSeries(job: string, instance: string): Array<{ series: string; values: string }> {
    const target = `job="${job}",instance="${instance}"`;
    const names = new Set<string>();
    for (const s of this.scrapes) for (const k of s?.keys() ?? []) names.add(k);
    const out = [
      {
        series: `up{${target}}`,
        values: this.scrapes.map((s) => (s ? '1' : '0')).join(' '),
      },
    ];
    for (const key of [...names].sort()) {
      const [, name, labels] = /^(\w+)\{(.*)\}$/.exec(key) as RegExpExecArray;
      out.push({
        series: `${name}{${target}${labels ? `,${labels}` : ''}}`,
        values: this.scrapes.map((s) => String(s?.get(key) ?? '_')).join(' '),
      });
    }
    return out;
  }
}

/** An `alert_rule_test` entry of promtool. */
export interface AlertTest {
  eval_time: string;
  alertname: string;
  exp_alerts: Array<{
    exp_labels: Record<string, string>;
    exp_annotations: Record<string, string>;
  }>;
}

/** Each scrape is one step of this many seconds in promtool's time. */
export const STEP_S = 15;
export const at = (step: number) => `${step * STEP_S}s`;

/**
 * `promtool test rules` of deploy/prometheus's rules on recorded series; its exit status and what
 * it printed (the file's path with it, to look at after a failure).
 */
export function promtoolOnRecorded(
  promtool: string,
  inputSeries: Array<{ series: string; values: string }>,
  tests: AlertTest[],
): { status: number | null; output: string } {
  const prom = join(ROOT, 'deploy/prometheus');
  const file = join(tempDir('pdctl-recorded-'), 'recorded.yml');
  writeFileSync(
    file,
    toYaml({
      rule_files: [join(prom, 'rules.yml'), join(prom, 'alerts.yml')],
      evaluation_interval: `${STEP_S}s`,
      tests: [{ interval: `${STEP_S}s`, input_series: inputSeries, alert_rule_test: tests }],
    }),
  );
  const r = spawnSync(promtool, ['test', 'rules', file], { encoding: 'utf8' });
  return { status: r.status, output: `${r.stdout}${r.stderr}\n(series in ${file})` };
}
