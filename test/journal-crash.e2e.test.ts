/**
 * Crash consistency: a child process appends under load and prints each acknowledged event id;
 * it is killed with SIGKILL at random moments. After every kill the journal must open, verify,
 * and contain every acknowledged event. PDCTL_CRASH_ROUNDS sets the rounds (default 30) for soaks;
 * PDCTL_CRASH_SEED replays a failing run.
 */
import Database from 'better-sqlite3';
import { describe, expect, it } from 'vitest';
import { SqliteJournal } from '../src/journal/sqlite/journal.ts';
import { spawnTs } from './helpers/spawn.ts';
import { tempDir } from './helpers/tmp.ts';

const ROUNDS = Number(process.env.PDCTL_CRASH_ROUNDS ?? 30);
const SEED = Number(process.env.PDCTL_CRASH_SEED ?? Date.now() % 1_000_000);

function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Starts the child, kills it `delayMs` after it is ready, and returns the ids it acknowledged. */
function runAndKill(path: string, durability: string, delayMs: number): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const child = spawnTs('test/helpers/crash-child.ts', [path, durability, '48']);
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
      if (signal !== 'SIGKILL')
        reject(new Error(`crash child exited by itself (code ${code}): ${stderr}`));
      else resolve(acked); // a partial last line was never fully acknowledged: ignore it
    });
  });
}

describe(`journal crash consistency (${ROUNDS} SIGKILL rounds, seed ${SEED})`, () => {
  it('keeps every acknowledged event and a consistent projection after every kill -9', async () => {
    const dir = tempDir('pdctl-crash-');
    const path = `${dir}/journal.db`;
    const rand = rng(SEED);
    const everAcked: string[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      const durability = round % 2 === 0 ? 'process' : 'power';
      const acked = await runAndKill(path, durability, Math.floor(rand() * 700));
      everAcked.push(...acked);
      // Open as a restarting control plane would (this runs WAL recovery), then verify.
      const journal = await SqliteJournal.open({ path, create: false });
      try {
        const report = await journal.verify();
        expect(
          report,
          `round ${round} (seed ${SEED}): ${JSON.stringify(report).slice(0, 500)}`,
        ).toMatchObject({ ok: true });
      } finally {
        await journal.drain();
      }
      const db = new Database(path, { readonly: true });
      const present = db.prepare('SELECT count(*) FROM events WHERE event_id = ?').pluck();
      const lost = everAcked.filter((id) => present.get(id) !== 1);
      db.close();
      expect(
        lost,
        `round ${round} (seed ${SEED}): acknowledged events missing after SIGKILL`,
      ).toEqual([]);
    }
    expect(everAcked.length).toBeGreaterThan(0);
  }, 600_000);
});
