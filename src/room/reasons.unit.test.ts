/**
 * The reasons are part of the interface: docs/design.md §3 lists each, with the same meaning.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  FAILURE_BLAME,
  FAILURE_REASONS,
  FAILURE_REPORTERS,
  isFailureReason,
  MIGRATION_REASONS,
  ROOM_FAILURE_REASONS,
  ROOM_MIGRATION_REASONS,
  TRANSFER_FAILURES,
} from './reasons.ts';

const design = readFileSync(join(import.meta.dirname, '../../docs/design.md'), 'utf8');
/** The rows `| \`reason\` | meaning |` of the design's tables. */
const documented = new Map(
  [...design.matchAll(/^\| `([a-z_]+)` +\| (.+?) +\|$/gm)].map((m) => [m[1], m[2]]),
);

describe('room reasons', () => {
  it('docs/design.md lists every failure and migration reason, with its meaning', () => {
    for (const r of FAILURE_REASONS) expect(documented.get(r), r).toBe(ROOM_FAILURE_REASONS[r]);
    for (const r of MIGRATION_REASONS) expect(documented.get(r), r).toBe(ROOM_MIGRATION_REASONS[r]);
  });

  it('counts as transfer failures only reasons of the list', () => {
    // (That every failed status of the transfer core is in the list is checked by the compiler:
    // the prefill engine fails a room with `transfer_${status}`, typed as a reason of the list.)
    for (const r of Object.keys(TRANSFER_FAILURES)) expect(isFailureReason(r), r).toBe(true);
  });

  it('blames one engine alone only for what that engine reports of itself', () => {
    for (const r of FAILURE_REASONS) {
      const { blame } = FAILURE_BLAME[r];
      const by = FAILURE_REPORTERS[r];
      if (blame === 'prefill' || blame === 'decode') expect(by, r).toEqual([blame]);
      if (by.includes('control')) expect(by, r).toEqual(['control']);
      if (blame === 'reporter') expect(by.includes('control'), r).toBe(false);
    }
  });

  it('tells a reason of the list from text the journal holds', () => {
    expect(isFailureReason('kv_pool_full')).toBe(true);
    expect(isFailureReason('toString')).toBe(false);
    expect(isFailureReason('something an older engine wrote')).toBe(false);
    expect(isFailureReason(null)).toBe(false);
  });
});
