/**
 * Entry point of the thread that scans a serving journal with SQLite's `quick_check` after the
 * control plane started on it (journal.ts `scanInBackground`), on a read-only connection of its
 * own: the writer goes on committing meanwhile, and the scan reads one consistent snapshot.
 */
import { parentPort, workerData } from 'node:worker_threads';
import Database from 'better-sqlite3';
import { quickCheck } from './precheck.ts';

export interface ScanResult {
  /** Null: the file is whole. */
  problem: string | null;
  ms: number;
}

const port = parentPort;
if (!port) throw new Error('scan-thread.ts must run in a worker thread');
const { path } = workerData as { path: string };
const t0 = performance.now();
let problem: string | null;
try {
  const db = new Database(path, { readonly: true, fileMustExist: true });
  try {
    problem = quickCheck(db);
  } finally {
    db.close();
  }
} catch (err) {
  problem = `it cannot be opened to read: ${(err as Error).message}`;
}
port.postMessage({ problem, ms: performance.now() - t0 } satisfies ScanResult);
