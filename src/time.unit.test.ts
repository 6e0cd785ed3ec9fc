import { describe, expect, it } from 'vitest';
import { UsageError } from './errors.ts';
import { formatAge, formatDuration, parseDuration, parseTime } from './time.ts';

const NOW = Date.parse('2026-11-30T05:00:00.000Z');

describe('parseTime', () => {
  it.each([
    ['now', NOW],
    ['10m', NOW - 600_000],
    ['1h30m', NOW - 5_400_000],
    ['2026-11-30T03:12:00Z', Date.parse('2026-11-30T03:12:00Z')],
    ['2026-11-30T03:12:00', Date.parse('2026-11-30T03:12:00Z')],
    ['2026-11-30T04:12:00+01:00', Date.parse('2026-11-30T03:12:00Z')],
    ['2026-11-29', Date.parse('2026-11-29T00:00:00Z')],
    ['03:12', Date.parse('2026-11-30T03:12:00Z')],
    ['23:59:30', Date.parse('2026-11-29T23:59:30Z')],
    ['1796014000000', 1796014000000],
  ])('%s', (input, expected) => {
    expect(parseTime(input, NOW)).toBe(expected);
  });

  it.each(['yesterday', '10 minutes', '25:00', '2026-13-45T00:00:00Z', '', '-5m'])(
    'refuses %j with a hint',
    (input) => {
      expect(() => parseTime(input, NOW)).toThrow(UsageError);
      expect(() => parseTime(input, NOW)).toThrow(/ISO-8601|clock time/);
    },
  );
});

describe('parseDuration and formatDuration', () => {
  it('parses units and combinations', () => {
    expect(parseDuration('500ms')).toBe(500);
    expect(parseDuration('7d')).toBe(604_800_000);
    expect(parseDuration('1h30m')).toBe(5_400_000);
    expect(() => parseDuration('7 days')).toThrow(/e\.g\. 500ms/);
    expect(() => parseDuration('')).toThrow(UsageError);
  });

  it('prints durations at a readable scale', () => {
    expect([0.25, 12, 1240, 185_000, 7_620_000].map(formatDuration)).toEqual([
      '250µs',
      '12ms',
      '1.24s',
      '3m05s',
      '2h07m',
    ]);
  });

  it('prints an age as parseDuration reads it back', () => {
    const ages = [300_000, 5_400_000, 604_800_000, 90_250, 0];
    expect(ages.map(formatAge)).toEqual(['5m', '1h30m', '7d', '1m30s250ms', '0ms']);
    expect(ages.map((ms) => parseDuration(formatAge(ms)))).toEqual(ages);
  });
});
