/**
 * Journals of rooms that ended a while ago, as retention and `journal prune` meet them: written by
 * `pdctl journal synth`, read back by `pdctl rooms`, as an operator would.
 */
import { expect } from 'vitest';
import { pdctl } from './spawn.ts';

/** Writes at `path` a journal of `rooms` rooms that ended 20 to 50 minutes ago, and the engines' events before them. */
export async function oldJournal(path: string, rooms = 60): Promise<string> {
  const r = await pdctl([
    ...['journal', 'synth', '--rooms', String(rooms), '--span', '30m', '--end', '20m'],
    ...['--journal', path],
  ]);
  expect(r.code, r.stderr).toBe(0);
  return path;
}

/** The ids of the rooms `pdctl rooms` lists from `where` (`--journal F`, `--archive D`, `--url U`). */
export async function roomIds(where: string[]): Promise<string[]> {
  const r = await pdctl(['rooms', '--json', '--limit', '10000', ...where]);
  expect(r.code, r.stderr).toBe(0);
  return (JSON.parse(r.stdout) as { rooms: Array<{ room: string }> }).rooms.map((x) => x.room);
}
