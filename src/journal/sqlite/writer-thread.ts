/**
 * Entry point of the journal's writer thread. It owns the only writing connection: commits (and
 * their fsyncs at `power` durability) happen here, so the main thread's event loop never waits on
 * the disk. One request at a time, in arrival order.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { JournalError } from '../errors.ts';
import { BatchWriter } from './batch-writer.ts';
import { headVersion } from './migrate.ts';
import { classifySqliteError, openDatabase } from './open.ts';
import type { WriterInit, WriterReply, WriterRequest } from './writer-protocol.ts';

const port = parentPort;
if (!port) throw new Error('writer-thread.ts must run in a worker thread');
const init = workerData as WriterInit;

function plain(err: unknown): { code: string; message: string } {
  const e = classifySqliteError(err, init.path);
  if (e instanceof JournalError) return e.toJSON();
  const code = (e as { code?: unknown })?.code;
  return {
    code: 'JOURNAL_WRITE_FAILED',
    message: `${typeof code === 'string' ? `${code}: ` : ''}${(e as Error)?.message ?? String(e)}`,
  };
}

function reply(msg: WriterReply): void {
  port?.postMessage(msg);
}

let writer: BatchWriter;
let db: ReturnType<typeof openDatabase>;
try {
  db = openDatabase({ path: init.path, durability: init.durability, create: init.create });
  writer = new BatchWriter(db, { roomCacheSize: init.roomCacheSize });
  const headSeq =
    (db.prepare('SELECT coalesce(max(seq), 0) FROM events').pluck().get() as number) ?? 0;
  reply({ op: 'ready', headSeq, schemaVersion: headVersion() });
} catch (err) {
  reply({ op: 'open_failed', error: plain(err) });
  process.exit(0);
}

port.on('message', (req: WriterRequest) => {
  try {
    switch (req.op) {
      case 'append':
        reply({ id: req.id, ok: true, outcomes: writer.append(req.events) });
        return;
      case 'cursor':
        writer.setCursor(req.name, req.seq, req.ts);
        reply({ id: req.id, ok: true });
        return;
      case 'prune':
        reply({ id: req.id, ok: true, prune: writer.prune(req.cutoffTs, req.chunkRooms) });
        return;
      case 'close':
        db.close();
        reply({ id: req.id, ok: true });
        port.close();
        return;
    }
  } catch (err) {
    reply({ id: req.id, ok: false, error: plain(err) });
  }
});
