/**
 * A journal writer under load, for the crash-consistency test: appends room lifecycles from many
 * concurrent appenders and prints `ack <eventId>` for each append once it has been committed.
 * The parent kills it with SIGKILL and checks that every acknowledged event survived.
 */

import { SqliteJournal } from '../../src/journal/sqlite/journal.ts';
import { completedRoomEvents } from '../../src/journal/synth.ts';
import type { EventInput } from '../../src/room/events.ts';
import { uuidv7 } from '../../src/room/ids.ts';

const [path, durability = 'process', concurrency = '32'] = process.argv.slice(2);
if (!path) throw new Error('usage: crash-child.ts PATH [durability] [concurrency]');

const journal = await SqliteJournal.open({ path, durability: durability as 'process' | 'power' });
process.stdout.write('ready\n');

let n = 0;
async function appender(worker: number): Promise<never> {
  for (;;) {
    const room = `r-${process.pid}-${worker}-${n++}`;
    for (const ev of completedRoomEvents(room, 'p0', 'd0', 'crash')) {
      const eventId = uuidv7();
      await journal.append({ ...ev, eventId } as EventInput);
      // Pipes to the parent are synchronous on Linux: once this returns, the parent can read it.
      process.stdout.write(`ack ${eventId}\n`);
    }
  }
}

await Promise.all(Array.from({ length: Number(concurrency) }, (_, i) => appender(i)));
