/**
 * The crash-consistency drill for the journal: a child process appends under load and prints each
 * acknowledged event id; it is killed with SIGKILL at a random moment; the journal must then open,
 * verify, and contain every event ever acknowledged. Used by the CI test (30 rounds) and by
 * `npm run soak:journal -- --rounds N`.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import type { EventRow } from '../../src/journal/rows.ts';
import { SqliteJournal } from '../../src/journal/sqlite/journal.ts';
import type { VerifyReport } from '../../src/journal/store.ts';
import { rng } from '../../src/journal/synth.ts';
import { eventIdOf } from '../../src/room/event-keys.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

/** Starts the child, kills it `delayMs` after it is ready, and returns the ids it acknowledged. */
function runAndKill(
  path: string,
  durability: string,
  delayMs: number,
  children: Set<ChildProcess>,
): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', 'test/helpers/crash-child.ts', path, durability, '48'],
      {
        cwd: ROOT,
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    children.add(child);
    let buf = '';
    let stderr = '';
    const acked: string[] = [];
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    child.stdout?.on('data', (d: Buffer) => {
      buf += d.toString();
      const lines = buf.split('\n');
      buf = lines.pop() ?? '';
      for (const line of lines) {
        if (line === 'ready') setTimeout(() => child.kill('SIGKILL'), delayMs);
        else if (line.startsWith('ack ')) acked.push(line.slice(4));
      }
    });
    child.once('exit', (code, signal) => {
      children.delete(child);
      if (signal !== 'SIGKILL')
        reject(new Error(`crash child exited by itself (code ${code}): ${stderr}`));
      else resolve(acked); // a partial last line was never fully acknowledged: ignore it
    });
  });
}

export interface CrashRound {
  round: number;
  durability: string;
  killAfterMs: number;
  acked: number;
  verify: VerifyReport;
  /** Acknowledged event ids (from any round so far) missing from the journal. */
  lost: string[];
}

/** Runs `rounds` kill -9 rounds against one journal file; stops at the first bad round. */
export async function crashRounds(opts: {
  path: string;
  rounds: number;
  seed: number;
  onRound?: (r: CrashRound) => void;
}): Promise<{ rounds: CrashRound[]; acked: number }> {
  const rand = rng(opts.seed);
  const everAcked: string[] = [];
  const rounds: CrashRound[] = [];
  const children = new Set<ChildProcess>();
  try {
    for (let round = 0; round < opts.rounds; round++) {
      const durability = round % 2 === 0 ? 'process' : 'power';
      const killAfterMs = Math.floor(rand() * 700);
      const acked = await runAndKill(opts.path, durability, killAfterMs, children);
      everAcked.push(...acked);
      // Open as a restarting control plane would (this runs WAL recovery), then verify.
      const journal = await SqliteJournal.open({ path: opts.path, create: false });
      let verify: VerifyReport;
      try {
        verify = await journal.verify();
      } finally {
        await journal.drain();
      }
      const db = new Database(opts.path, { readonly: true });
      const stored = new Map<string, number>();
      for (const r of db.prepare('SELECT event_id, source FROM events').all() as EventRow[]) {
        const id = eventIdOf(r.event_id, r.source);
        stored.set(id, (stored.get(id) ?? 0) + 1);
      }
      const lost = everAcked.filter((id) => stored.get(id) !== 1);
      db.close();
      const r = { round, durability, killAfterMs, acked: acked.length, verify, lost };
      rounds.push(r);
      opts.onRound?.(r);
      if (!verify.ok || lost.length > 0) break;
    }
  } finally {
    for (const child of children) child.kill('SIGKILL');
  }
  return { rounds, acked: everAcked.length };
}
