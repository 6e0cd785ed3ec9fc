/**
 * The journal writer's own work, inline: what bench:journal states its append targets against, and
 * bench:engines the floor of a lone room's commits.
 */
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { executeOp, openWriter } from '../src/journal/sqlite/writer-exec.ts';
import { completedRoomEvents } from '../src/journal/synth.ts';
import { type PendingEvent, validateEvent } from '../src/room/events.ts';

/** Room lifecycles, validated as the queue validates them, `rooms` of them interleaved by step. */
function lifecycleBatches(rooms: number, events: number): PendingEvent[][] {
  const batches: PendingEvent[][] = [];
  for (let r = 0, n = 0; n < events; r += rooms) {
    const lives = Array.from({ length: rooms }, (_, i) => completedRoomEvents(`r-${r + i}`));
    for (let step = 0; step < (lives[0]?.length ?? 0); step++) {
      batches.push(lives.map((life) => validateEvent(life[step])));
      n += rooms;
    }
  }
  return batches;
}

/**
 * The writer's own work with nothing around it: its code (BatchWriter: reduce, insert the event,
 * write the room's row, commit) on this thread at `power` — no queue, no thread hop, no promises.
 *
 * - `frames`: WAL frames one single-event commit writes (the WAL's growth over 500 commits of room
 *   lifecycles, checkpoints off meanwhile; a frame is a page and its 24-byte header).
 * - `oneEventPerSec`: single-event commits per second, WAL checkpoints as the writer runs them —
 *   what a single appender could reach if the journal cost nothing but SQLite.
 * - `batchPerSec`: events per second in batches of `batch` events of as many rooms — the same for
 *   the 256-appender run, whose average batch is about that size (null: `batch` null, not run).
 *
 * Its databases go in `dir`.
 */
export function inlineWriter(
  dir: string,
  seconds: number,
  batch: number | null,
): { frames: number; pageSize: number; oneEventPerSec: number; batchPerSec: number | null } {
  const open = (name: string) =>
    openWriter({
      path: join(dir, name),
      durability: 'power',
      roomCacheSize: 50_000,
      create: true,
      role: 'writer',
    });
  const w = open('inline-one.db');
  const pageSize = w.db.pragma('page_size', { simple: true }) as number;
  const singles = lifecycleBatches(1, 100_000);
  let i = 0;
  const append = () =>
    executeOp(w, { op: 'append', events: singles[i++] as PendingEvent[], fence: 0 });
  for (let k = 0; k < 100; k++) append(); // past the first pages of every table and index
  w.db.pragma('wal_autocheckpoint = 0'); // the WAL only grows while it is measured
  const walPath = `${join(dir, 'inline-one.db')}-wal`;
  const before = statSync(walPath).size;
  for (let k = 0; k < 500; k++) append();
  const frames = (statSync(walPath).size - before) / (pageSize + 24) / 500;
  w.db.pragma('wal_checkpoint(TRUNCATE)');
  w.db.pragma('wal_autocheckpoint = 1000'); // as the writer runs at power: SQLite's default
  let n = 0;
  const t = performance.now();
  while (performance.now() - t < seconds * 1000 && i < singles.length) {
    append();
    n++;
  }
  const oneEventPerSec = Math.round(n / ((performance.now() - t) / 1000));
  executeOp(w, { op: 'close' });
  if (batch === null)
    return { frames: Number(frames.toFixed(2)), pageSize, oneEventPerSec, batchPerSec: null };

  const wb = open('inline-batch.db');
  const batches = lifecycleBatches(batch, 100_000);
  const tb = performance.now();
  let events = 0;
  for (const b of batches) {
    executeOp(wb, { op: 'append', events: b, fence: 0 });
    events += b.length;
  }
  const batchPerSec = Math.round(events / ((performance.now() - tb) / 1000));
  executeOp(wb, { op: 'close' });
  return { frames: Number(frames.toFixed(2)), pageSize, oneEventPerSec, batchPerSec };
}
