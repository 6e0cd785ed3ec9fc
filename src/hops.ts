/**
 * Marks of a room's steps in every process, on one wall clock, for finding where a hop's time goes
 * (docs/critical-path.md, `npm run hops`). With `PDCTL_HOPS=FILE` in the environment, the control
 * plane, its writer thread and every engine it starts append `step type room ms pid` lines to
 * FILE; the engines inherit the variable. Unset, as in production, a mark is one comparison.
 * Each mark is a synchronous append to the file (tens of µs): it moves what it measures a little.
 */
import { appendFileSync } from 'node:fs';

const file = process.env.PDCTL_HOPS || null;

/** Whether marks are being written (to skip a loop that would only mark). */
export const hopsOn = file !== null;

/** Marks `step` of `room` (an event of `type`, if any) now, or at `at` (ms since the epoch). */
export function hop(step: string, type: string | null, room: string | null, at?: number): void {
  if (file === null) return;
  const ms = at ?? performance.timeOrigin + performance.now();
  appendFileSync(file, `${step} ${type ?? '-'} ${room ?? '-'} ${ms.toFixed(3)} ${process.pid}\n`);
}

/** Now on the marks' clock (ms since the epoch, sub-ms), for a mark made later with `at`. */
export function hopClock(): number {
  return file === null ? 0 : performance.timeOrigin + performance.now();
}

/** One step in one process: ms from the room's submit (p50, p90 over the rooms that have it). */
export interface HopRow {
  process: string;
  step: string;
  p50: number;
  p90: number;
  rooms: number;
}

/**
 * The marks of a PDCTL_HOPS file as steps in order (scripts/hops.ts prints them): per room, each
 * step's first mark in each process, in ms from its `submit`. Processes are named by what they
 * marked: `submit` the control plane, `compute` a prefill engine, anything else a decode engine.
 */
export function summarizeHops(text: string): {
  rooms: number;
  marks: number;
  processes: number;
  rows: HopRow[];
} {
  const marks: Array<{ step: string; type: string; room: string; ms: number; pid: string }> = [];
  for (const line of text.split('\n')) {
    const [step, type, room, ms, pid] = line.split(' ');
    if (step && type && room && ms && pid) marks.push({ step, type, room, ms: Number(ms), pid });
  }
  marks.sort((a, b) => a.ms - b.ms);
  const role = new Map<string, string>();
  for (const m of marks) if (m.step === 'submit') role.set(m.pid, 'control plane');
  for (const m of marks) if (m.step === 'compute' && !role.has(m.pid)) role.set(m.pid, 'prefill');
  for (const m of marks) if (!role.has(m.pid)) role.set(m.pid, 'decode');
  const submitted = new Map<string, number>();
  for (const m of marks) if (m.step === 'submit') submitted.set(m.room, m.ms);
  const after = new Map<string, { process: string; step: string; ms: number[] }>();
  const seen = new Set<string>();
  for (const m of marks) {
    const t0 = submitted.get(m.room);
    if (t0 === undefined || m.step === 'submit') continue;
    const process = role.get(m.pid) as string;
    const step = m.type === '-' ? m.step : `${m.step} ${m.type}`;
    const key = `${process}\t${step}`;
    if (seen.has(`${m.room}\t${key}`)) continue;
    seen.add(`${m.room}\t${key}`);
    const entry = after.get(key) ?? { process, step, ms: [] };
    entry.ms.push(m.ms - t0);
    after.set(key, entry);
  }
  const at = (sorted: number[], p: number) =>
    sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))] as number;
  const rows = [...after.values()]
    .map(({ process, step, ms }) => {
      const sorted = ms.sort((a, b) => a - b);
      return { process, step, p50: at(sorted, 50), p90: at(sorted, 90), rooms: sorted.length };
    })
    .sort((a, b) => a.p50 - b.p50);
  return { rooms: submitted.size, marks: marks.length, processes: role.size, rows };
}
