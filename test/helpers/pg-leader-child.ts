/**
 * A control plane's journal under load, for the fencing test: leads a PostgreSQL journal with a
 * short lease and appends a room every 20 ms, printing `led <term>`, then `ack <room>` for every
 * acknowledged append, `refused <code>` for every refused one, and `deposed` once fenced. The
 * parent freezes it with SIGSTOP and wakes it after a standby has taken over.
 */
import { PgJournal } from '../../src/journal/postgres/journal.ts';

const [url, holder = 'child', leaseMs = '600'] = process.argv.slice(2);
if (!url) throw new Error('usage: pg-leader-child.ts URL [holder] [leaseMs]');

const journal = await PgJournal.open({ url, holder, leaseMs: Number(leaseMs) });
journal.onDeposed(() => process.stdout.write('deposed\n'));
process.stdout.write(`led ${journal.leadership.term}\n`);
for (let i = 0; ; i++) {
  const room = `${holder}-${i}`;
  try {
    await journal.append({
      type: 'room.created',
      room,
      source: 'test',
      data: { prefillEngine: 'p0', decodeEngine: 'd0' },
    });
    process.stdout.write(`ack ${room}\n`);
  } catch (err) {
    process.stdout.write(`refused ${(err as { code?: string }).code}\n`);
  }
  await new Promise((r) => setTimeout(r, 20));
}
