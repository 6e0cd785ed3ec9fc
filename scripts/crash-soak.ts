/**
 * Long crash soak of the journal: `npm run soak:journal -- --rounds 500 [--seed N] [--keep]`.
 * Each round SIGKILLs a loaded writer at a random moment, then checks the journal (see
 * test/helpers/crash.ts). Prints one line per round; exits 1 at the first bad round.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { checkFlags, flag, has } from '../bench/args.ts';
import { crashRounds } from '../test/helpers/crash.ts';

const count = (name: string, fallback: number) => {
  const text = flag(name, String(fallback));
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) {
    process.stderr.write(`${name} needs a positive integer, got "${text}"\n`);
    process.exit(2);
  }
  return n;
};
const rounds = count('--rounds', 100);
const seed = count('--seed', Date.now() % 1_000_000);
const keep = has('--keep');
checkFlags();
const dir = mkdtempSync(join(tmpdir(), 'pdctl-soak-'));
const path = join(dir, 'journal.db');
process.stdout.write(`crash soak: ${rounds} rounds, seed ${seed}, journal ${path}\n`);
const started = Date.now();
const result = await crashRounds({
  path,
  rounds,
  seed,
  onRound: (r) =>
    process.stdout.write(
      `round ${String(r.round + 1).padStart(4)}/${rounds}  ${r.durability.padEnd(7)} kill after ${String(r.killAfterMs).padStart(3)}ms  ` +
        `${String(r.acked).padStart(6)} acked  ${r.verify.events} events  verify ${r.verify.ok ? 'ok' : 'FAILED'}  lost ${r.lost.length}\n`,
    ),
});
const bad = result.rounds.find((r) => !r.verify.ok || r.lost.length > 0);
process.stdout.write(
  bad
    ? `FAILED at round ${bad.round + 1} (seed ${seed}); journal kept at ${path}\n`
    : `${result.rounds.length} rounds passed: ${result.acked} acknowledged events, none lost, in ${((Date.now() - started) / 1000).toFixed(0)}s\n`,
);
if (!bad && !keep) rmSync(dir, { recursive: true, force: true });
process.exitCode = bad ? 1 : 0;
