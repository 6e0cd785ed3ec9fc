/**
 * Entry point of the journal's threads. As `writer` it owns the only writing connection, so
 * commits and their fsyncs (at `power` durability) never hold up the main thread's event loop.
 * As `checkpointer` it copies the WAL into the database for an inline writer, so those fsyncs
 * stay off the main thread too. One request at a time, in arrival order.
 */

import { parentPort, workerData } from 'node:worker_threads';
import { hop, hopsOn } from '../../hops.ts';
import { executeOp, openWriter, toPlainError } from './writer-exec.ts';
import type { WriterInit, WriterReply, WriterRequest } from './writer-protocol.ts';

const port = parentPort;
if (!port) throw new Error('writer-thread.ts must run in a worker thread');
const init = workerData as WriterInit;
const reply = (msg: WriterReply) => port.postMessage(msg);

let opened: ReturnType<typeof openWriter>;
try {
  opened = openWriter(init);
  reply({ op: 'ready', headSeq: opened.headSeq, synchronous: opened.synchronous });
} catch (err) {
  reply({ op: 'open_failed', error: toPlainError(err, init.path) });
  process.exit(0);
}

port.on('message', (req: WriterRequest) => {
  if (req.op === 'crash') process.exit(70); // a drill: in a worker this ends the thread only
  try {
    if (hopsOn && req.op === 'append')
      for (const e of req.events) hop('writer-has', e.type, e.room);
    const result = executeOp(opened, req);
    if (hopsOn && req.op === 'append')
      for (const e of req.events) hop('writer-done', e.type, e.room);
    reply({ id: req.id, ok: true, ...result });
    if (req.op === 'close') port.close();
  } catch (err) {
    reply({ id: req.id, ok: false, error: toPlainError(err, init.path) });
  }
});
