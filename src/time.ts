/** Times and durations on the command line. All clock times are UTC, as the journal prints them. */

import { UsageError } from './errors.ts';

const UNITS: Record<string, number> = {
  ms: 1,
  s: 1000,
  m: 60_000,
  h: 3_600_000,
  d: 86_400_000,
  w: 604_800_000,
};

/** `500ms`, `30s`, `10m`, `2h`, `7d`, `1w`, or a combination such as `1h30m`. */
export function parseDuration(input: string, what = 'duration'): number {
  const s = input.trim();
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h|d|w)/gy;
  let total = 0;
  let matched = 0;
  for (let m = re.exec(s); m; m = re.exec(s)) {
    total += Number(m[1]) * (UNITS[m[2] as string] as number);
    matched = re.lastIndex;
  }
  if (s.length === 0 || matched !== s.length) {
    throw new UsageError(
      `invalid ${what} "${input}": use a number with a unit, e.g. 500ms, 30s, 10m, 2h, 7d, 1h30m`,
    );
  }
  return Math.round(total);
}

/**
 * A point in time: ISO-8601 (`2026-11-30T03:12:00Z`; no offset means UTC), a relative age
 * (`10m` = ten minutes ago), a UTC clock time today (`03:12`, or yesterday if that is still to
 * come), unix milliseconds, or `now`.
 */
export function parseTime(input: string, now: number = Date.now()): number {
  const s = input.trim();
  if (s === 'now') return now;
  if (/^\d{12,}$/.test(s)) return Number(s);
  if (/^\d+(\.\d+)?(ms|s|m|h|d|w)/.test(s)) return now - parseDuration(s, 'time');
  const clock = /^(\d{1,2}):(\d{2})(?::(\d{2})(?:\.(\d{1,3}))?)?$/.exec(s);
  if (clock) {
    const [h, m, sec, ms] = [
      Number(clock[1]),
      Number(clock[2]),
      Number(clock[3] ?? 0),
      Number((clock[4] ?? '0').padEnd(3, '0')),
    ];
    if (h > 23 || m > 59 || sec > 59) throw new UsageError(`invalid clock time "${input}"`);
    const d = new Date(now);
    let t = Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate(), h, m, sec, ms);
    if (t > now) t -= UNITS.d as number;
    return t;
  }
  if (/^\d{4}-\d{2}-\d{2}/.test(s)) {
    const withZone = /([zZ]|[+-]\d{2}:?\d{2})$/.test(s) || !s.includes('T') ? s : `${s}Z`;
    const t = Date.parse(s.includes('T') ? withZone : `${s}T00:00:00Z`);
    if (!Number.isNaN(t)) return t;
  }
  throw new UsageError(
    `invalid time "${input}": use ISO-8601 (2026-11-30T03:12:00Z), an age (10m, 2h, 7d), a UTC clock time (03:12), unix ms, or now`,
  );
}

export function formatTs(ms: number | null): string {
  return ms === null ? '-' : new Date(ms).toISOString();
}

/** A duration as `parseDuration` reads it, largest units first: `5m`, `1h30m`, `7d`, `250ms`. */
export function formatAge(ms: number): string {
  let left = Math.round(ms);
  let out = '';
  for (const unit of ['d', 'h', 'm', 's', 'ms'] as const) {
    const size = UNITS[unit] as number;
    if (left >= size) {
      out += `${Math.floor(left / size)}${unit}`;
      left %= size;
    }
  }
  return out || '0ms';
}

/** `850µs`, `12ms`, `1.24s`, `3m05s`, `2h07m`. */
export function formatDuration(ms: number | null): string {
  if (ms === null) return '-';
  if (ms < 1) return `${Math.round(ms * 1000)}µs`;
  if (ms < 1000) return `${Math.round(ms)}ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(2)}s`;
  if (ms < 3_600_000)
    return `${Math.floor(ms / 60_000)}m${String(Math.floor((ms % 60_000) / 1000)).padStart(2, '0')}s`;
  return `${Math.floor(ms / 3_600_000)}h${String(Math.floor((ms % 3_600_000) / 60_000)).padStart(2, '0')}m`;
}
