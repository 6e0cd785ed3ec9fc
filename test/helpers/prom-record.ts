/**
 * Series recorded from a real run, for `promtool test rules`: each scrape of /metrics is one step
 * of a promtool test (`interval` apart in its time), a scrape that fails is `up` 0 with every pdctl
 * series missing (`_`) at that step — as Prometheus would have stored them.
 */

/** One scrape: series (name with its labels, in the exposition's text) → value; null: it failed. */
type Scrape = Map<string, number> | null;

export class MetricsRecorder {
  readonly scrapes: Scrape[] = [];

  constructor(private readonly url: string) {}

  async scrape(): Promise<void> {
    try {
      const res = await fetch(`${this.url}/metrics`, { signal: AbortSignal.timeout(2000) });
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
