/**
 * Where commits run. `power` durability fsyncs every commit, so its writer is a thread and the
 * event loop never waits on the disk. `process` durability does not fsync on commit, so its writer
 * runs inline on the main thread (a commit costs tens of microseconds, less than a hop to a
 * thread and back) while a checkpointer thread does the WAL checkpoints, which do fsync.
 */
import { Worker } from 'node:worker_threads';
import type { Logger } from '../../log.ts';
import { JournalError } from '../errors.ts';
import { executeOp, type OpenedWriter, openWriter, toPlainError } from './writer-exec.ts';
import type { WriterInit, WriterOp, WriterReply, WriterResult } from './writer-protocol.ts';

export interface Writer {
  readonly kind: 'inline' | 'thread';
  /** False while a crashed writer thread is being restarted. */
  readonly ready: boolean;
  /** Times the writer thread was restarted after it died (0 for an inline writer). */
  readonly restarts: number;
  /** The writing connection's `synchronous`, as SQLite reports it (writer-exec.ts). */
  readonly synchronous: string;
  run(op: WriterOp): Promise<WriterResult>;
  /** Closes the writing connection after the work already handed over. */
  close(): Promise<void>;
  /** Stops at once; work in flight fails with JOURNAL_CLOSED. */
  terminate(): void;
  /** Drills only: the writer thread dies as if it had crashed (inline writers have none). */
  crash(): void;
}

export interface WriterHooks {
  log: Logger;
  /** A restarted writer thread is up again: pending work can be flushed. */
  onRestarted(): void;
}

/** A thread of the journal's (`writer-thread` for writers and checkpointers, `scan-thread`). */
export function spawnThread(name: 'writer-thread' | 'scan-thread', workerData: unknown): Worker {
  const here = import.meta.url;
  if (here.endsWith('.ts')) {
    // Running from source (tests, tsx): load the TypeScript entry through tsx's loader.
    const entry = new URL(`./${name}.ts`, here).href;
    const code = `import('tsx/esm/api').then((m) => { m.register(); return import(${JSON.stringify(entry)}); });`;
    return new Worker(code, { eval: true, workerData });
  }
  return new Worker(new URL(`./${name}.js`, here), { workerData });
}

/** Starts a thread and waits for it to open the journal. */
function startThread(
  init: WriterInit,
): Promise<{ worker: Worker; headSeq: number; synchronous: string }> {
  return new Promise((resolve, reject) => {
    const worker = spawnThread('writer-thread', init);
    const cleanup = () => {
      worker.off('message', onMessage);
      worker.off('error', onError);
      worker.off('exit', onExit);
    };
    const onMessage = (msg: WriterReply) => {
      if (!('op' in msg)) return;
      cleanup();
      if (msg.op === 'ready')
        resolve({ worker, headSeq: msg.headSeq, synchronous: msg.synchronous });
      else {
        void worker.terminate();
        reject(JournalError.from(msg.error));
      }
    };
    const onError = (err: Error) => {
      cleanup();
      reject(
        new JournalError(
          'JOURNAL_WRITE_FAILED',
          `journal ${init.role} thread failed to start: ${err.message}`,
          { cause: err },
        ),
      );
    };
    const onExit = (code: number) => {
      cleanup();
      reject(
        new JournalError(
          'JOURNAL_WRITE_FAILED',
          `journal ${init.role} thread exited during start (code ${code})`,
        ),
      );
    };
    worker.on('message', onMessage);
    worker.on('error', onError);
    worker.on('exit', onExit);
  });
}

type Pending = { resolve: (r: WriterResult) => void; reject: (e: unknown) => void };

/** A thread that runs writer ops one at a time, matched to replies by id. */
class ThreadChannel {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();

  constructor(
    readonly worker: Worker,
    onExit: (code: number) => void,
    log: Logger,
  ) {
    worker.on('message', (msg: WriterReply) => {
      if (!('id' in msg)) return;
      const p = this.pending.get(msg.id);
      this.pending.delete(msg.id);
      if (!p) return;
      if (msg.ok) p.resolve(msg);
      else p.reject(JournalError.from(msg.error));
    });
    worker.on('error', (err) => log.error({ err }, 'journal thread threw'));
    worker.on('exit', onExit);
  }

  run(op: WriterOp): Promise<WriterResult> {
    return new Promise((resolve, reject) => {
      const id = this.nextId++;
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ ...op, id });
    });
  }

  failAll(err: JournalError): void {
    for (const p of this.pending.values()) p.reject(err);
    this.pending.clear();
  }
}

const RESTART_BACKOFF_MS = [50, 200, 1000, 5000];

/** The writer on its own thread, supervised: if it ever exits unasked, it is started again. */
class ThreadWriter implements Writer {
  readonly kind = 'thread';
  private channel: ThreadChannel | null;
  /** Consecutive failed starts, for the back-off; reset once a thread is up. */
  private attempts = 0;
  restarts = 0;
  private stopping = false;

  constructor(
    private readonly init: WriterInit,
    worker: Worker,
    private readonly hooks: WriterHooks,
    readonly synchronous: string,
  ) {
    this.channel = this.attach(worker);
  }

  get ready(): boolean {
    return this.channel !== null;
  }

  private attach(worker: Worker): ThreadChannel {
    const channel: ThreadChannel = new ThreadChannel(
      worker,
      (code) => this.onExit(channel, code),
      this.hooks.log,
    );
    return channel;
  }

  private onExit(channel: ThreadChannel, code: number): void {
    if (this.channel !== channel) return;
    this.channel = null;
    channel.failAll(
      new JournalError(
        'JOURNAL_WRITE_FAILED',
        `journal writer thread exited (code ${code}); the outcome of this request is unknown, retry it with the same eventId`,
      ),
    );
    if (this.stopping) return;
    this.scheduleRestart(code);
  }

  private scheduleRestart(code: number): void {
    const delay = RESTART_BACKOFF_MS[
      Math.min(this.attempts, RESTART_BACKOFF_MS.length - 1)
    ] as number;
    this.attempts++;
    this.hooks.log.error(
      { code, restartInMs: delay, attempt: this.attempts },
      'journal writer thread exited; restarting it',
    );
    setTimeout(() => {
      if (this.stopping) return;
      startThread(this.init).then(
        ({ worker }) => {
          if (this.stopping) {
            void worker.terminate();
            return;
          }
          this.channel = this.attach(worker);
          this.attempts = 0;
          this.restarts++;
          this.hooks.log.info({}, 'journal writer thread restarted');
          this.hooks.onRestarted();
        },
        (err) => {
          this.hooks.log.error({ err }, 'journal writer thread failed to restart');
          this.scheduleRestart(-1);
        },
      );
    }, delay).unref();
  }

  run(op: WriterOp): Promise<WriterResult> {
    if (!this.channel) {
      return Promise.reject(
        new JournalError(
          'JOURNAL_WRITE_FAILED',
          'journal writer thread is restarting; retry shortly',
        ),
      );
    }
    return this.channel.run(op);
  }

  async close(): Promise<void> {
    this.stopping = true;
    const channel = this.channel;
    if (!channel) return;
    const exited = new Promise((r) => channel.worker.once('exit', r));
    await channel.run({ op: 'close' }).catch(() => undefined);
    await Promise.race([exited, new Promise((r) => setTimeout(r, 1000).unref())]);
    this.channel = null;
    await channel.worker.terminate();
  }

  terminate(): void {
    this.stopping = true;
    const channel = this.channel;
    this.channel = null;
    if (!channel) return;
    channel.failAll(new JournalError('JOURNAL_CLOSED', 'journal was closed'));
    void channel.worker.terminate();
  }

  crash(): void {
    this.channel?.worker.postMessage({ id: 0, op: 'crash' });
  }
}

const CHECKPOINT_EVERY_MS = 500;

/** The writer on the main thread, with a checkpointer thread for the WAL. */
class InlineWriter implements Writer {
  readonly kind = 'inline';
  readonly ready = true;
  readonly restarts = 0;
  readonly synchronous: string;
  private checkpointer: ThreadChannel | null = null;
  private dirty = false;
  private checkpointing = false;
  private readonly timer: NodeJS.Timeout | null;
  private closed = false;

  constructor(
    private readonly opened: OpenedWriter,
    private readonly init: WriterInit,
    private readonly hooks: WriterHooks,
  ) {
    this.synchronous = opened.synchronous;
    this.timer =
      init.walCheckpoints === 'inline'
        ? null
        : setInterval(() => this.checkpoint(), CHECKPOINT_EVERY_MS).unref();
  }

  private checkpoint(): void {
    if (!this.dirty || this.checkpointing || this.closed) return;
    this.dirty = false;
    this.checkpointing = true;
    const run = async () => {
      if (!this.checkpointer) {
        const { worker } = await startThread({ ...this.init, role: 'checkpointer', create: false });
        if (this.closed) {
          await worker.terminate(); // the journal closed while the thread was starting
          return;
        }
        const channel: ThreadChannel = new ThreadChannel(
          worker,
          () => {
            if (this.checkpointer === channel) this.checkpointer = null;
          },
          this.hooks.log,
        );
        this.checkpointer = channel;
        worker.unref();
      }
      await this.checkpointer.run({ op: 'checkpoint' });
    };
    run()
      .catch((err) => {
        this.dirty = true;
        this.hooks.log.warn({ err }, 'journal WAL checkpoint failed; it will be retried');
      })
      .finally(() => {
        this.checkpointing = false;
      });
  }

  run(op: WriterOp): Promise<WriterResult> {
    if (this.closed)
      return Promise.reject(new JournalError('JOURNAL_CLOSED', 'journal was closed'));
    try {
      const result = executeOp(this.opened, op);
      this.dirty = true;
      return Promise.resolve(result);
    } catch (err) {
      return Promise.reject(JournalError.from(toPlainError(err, this.init.path)));
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    const checkpointer = this.checkpointer;
    this.checkpointer = null;
    if (checkpointer) {
      checkpointer.worker.ref(); // unref'd while idle; the reply to close must keep us alive
      await checkpointer.run({ op: 'close' }).catch(() => undefined);
      await checkpointer.worker.terminate();
    }
    // The last connection to close checkpoints the WAL into the database and removes it.
    this.opened.db.pragma('wal_autocheckpoint = 1000');
    this.opened.db.close();
  }

  crash(): void {}

  terminate(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    if (this.checkpointer) void this.checkpointer.worker.terminate();
    this.checkpointer = null;
    this.opened.db.close();
  }
}

/** Opens the journal for writing and returns the writer that fits its durability. */
export async function startWriter(
  init: WriterInit,
  hooks: WriterHooks,
): Promise<{ writer: Writer; headSeq: number }> {
  if (init.durability === 'process') {
    const opened = openWriter(init);
    return { writer: new InlineWriter(opened, init, hooks), headSeq: opened.headSeq };
  }
  const { worker, headSeq, synchronous } = await startThread(init);
  return { writer: new ThreadWriter(init, worker, hooks, synchronous), headSeq };
}
