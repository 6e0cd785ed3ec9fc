/**
 * Where a room's time goes between processes: reads the marks `PDCTL_HOPS=FILE` made (src/hops.ts)
 * and prints, for each step in each process, the ms from the room's submit to that step — p50 and
 * p90 over the rooms, first occurrence per room — in the order they happen.
 *
 *   PDCTL_HOPS=/tmp/hops.log npm run bench:model -- --concurrency 1 --rounds 10 --prompts distinct
 *   npm run hops -- --file /tmp/hops.log
 *
 * Processes are named by what they marked: the one that marked `submit` is the control plane (its
 * writer thread too), an engine that marked `compute` is a prefill engine, any other a decode
 * engine. Steps: submit, queued / to-writer / writer-has / writer-done / settled / committed (an
 * event's way through the commit queue and the writer thread), arrived (an engine's append at the
 * control plane), engine-has / engine-appends (an engine's view), compute (a prefill's compute
 * begins), tokens (a room's tokens reach the control plane; the first is the first token).
 */
import { readFileSync } from 'node:fs';
import { checkFlags, flag } from '../bench/args.ts';
import { summarizeHops } from '../src/hops.ts';

// Piped into head: stop quietly when the reader has had enough.
process.stdout.on('error', (err: NodeJS.ErrnoException) => {
  if (err.code === 'EPIPE') process.exit(0);
  throw err;
});
const FILE = flag('--file', '');
checkFlags();
if (!FILE) {
  process.stderr.write('usage: npm run hops -- --file FILE (the PDCTL_HOPS file of a run)\n');
  process.exit(2);
}

const { rooms, marks, processes, rows } = summarizeHops(readFileSync(FILE, 'utf8'));
console.log(`${rooms} rooms, ${marks} marks, ${processes} processes (${FILE})\n`);
console.log('| process | step | ms from submit p50 | p90 | rooms |');
console.log('|---|---|--:|--:|--:|');
for (const r of rows)
  console.log(
    `| ${r.process} | ${r.step} | ${r.p50.toFixed(2)} | ${r.p90.toFixed(2)} | ${r.rooms} |`,
  );
