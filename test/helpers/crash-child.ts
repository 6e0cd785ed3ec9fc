/**
 * A journal writer under load, for the crash-consistency test: appends room lifecycles from many
 * concurrent appenders and prints `ack <eventId>` for each append once it has been committed.
 * The parent kills it with SIGKILL and checks that every acknowledged event survived.
 */

import type { EventInput } from '../../src/journal/events.ts';
import { uuidv7 } from '../../src/journal/ids.ts';
import { SqliteJournal } from '../../src/journal/sqlite/journal.ts';

const [path, durability = 'process', concurrency = '32'] = process.argv.slice(2);
if (!path) throw new Error('usage: crash-child.ts PATH [durability] [concurrency]');

const journal = await SqliteJournal.open({ path, durability: durability as 'process' | 'power' });
process.stdout.write('ready\n');

const lifecycle = (room: string): EventInput[] => [
  {
    type: 'room.created',
    room,
    source: 'crash',
    data: { prefillEngine: 'p0', decodeEngine: 'd0', promptTokens: 10 },
  },
  { type: 'room.bootstrap_started', room, engine: 'd0', source: 'd0', data: {} },
  { type: 'room.bootstrapped', room, engine: 'd0', source: 'd0', data: { pages: [1, 2] } },
  { type: 'room.prefill_started', room, engine: 'p0', source: 'p0', data: {} },
  { type: 'room.transfer_posted', room, engine: 'p0', source: 'p0', data: { pairs: 2 } },
  {
    type: 'room.transfer_completed',
    room,
    engine: 'p0',
    source: 'p0',
    data: { bytes: 8192, checksum: 'abc123', micros: 40 },
  },
  { type: 'room.released', room, engine: 'p0', source: 'p0', data: {} },
  { type: 'room.decode_started', room, engine: 'd0', source: 'd0', data: {} },
  {
    type: 'room.completed',
    room,
    engine: 'd0',
    source: 'd0',
    data: { tokens: 8, finishReason: 'stop' },
  },
  { type: 'room.released', room, engine: 'd0', source: 'd0', data: {} },
];

let n = 0;
async function appender(worker: number): Promise<never> {
  for (;;) {
    const room = `r-${process.pid}-${worker}-${n++}`;
    for (const ev of lifecycle(room)) {
      const eventId = uuidv7();
      await journal.append({ ...ev, eventId } as EventInput);
      // Pipes to the parent are synchronous on Linux: once this returns, the parent can read it.
      process.stdout.write(`ack ${eventId}\n`);
    }
  }
}

await Promise.all(Array.from({ length: Number(concurrency) }, (_, i) => appender(i)));
