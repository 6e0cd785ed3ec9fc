/**
 * One writer per journal. The writer keeps rooms in memory, so a second writer on the same file
 * (a `pdctl journal prune` beside a running control plane, say) would fold events against stale
 * state. The lock is a file beside the journal naming its holder; a holder that died (kill -9)
 * leaves it behind, and the next writer takes it over once that process is gone.
 */
import { closeSync, openSync, readFileSync, unlinkSync, writeSync } from 'node:fs';
import { hostname } from 'node:os';
import { resolve } from 'node:path';
import { isAlive } from '../../pids.ts';
import { JournalError } from '../errors.ts';

interface Holder {
  pid: number;
  host: string;
  since: number;
  command: string;
}

/** Journals this process writes: a second writer in the same process is refused too. */
const heldHere = new Set<string>();

function readHolder(lockPath: string): Holder | null {
  try {
    return JSON.parse(readFileSync(lockPath, 'utf8')) as Holder;
  } catch {
    return null; // unreadable or half-written: treated as stale
  }
}

export interface WriterLock {
  release(): void;
}

function readOnly(journalPath: string, err: unknown): JournalError {
  return new JournalError(
    'JOURNAL_READ_ONLY',
    `cannot write beside ${journalPath} (${(err as Error).message}): a read-only file or filesystem; a writer (pdctl serve, journal prune/migrate) needs it writable — fix the permissions or pass --data-dir on a writable disk. Read commands (pdctl rooms, journal verify) work on it as it is`,
    { cause: err },
  );
}

export function acquireWriterLock(journalPath: string): WriterLock {
  const key = resolve(journalPath);
  const lockPath = `${key}.writer.lock`;
  if (heldHere.has(key)) {
    throw new JournalError(
      'JOURNAL_BUSY',
      `journal ${journalPath} is already open for writing in this process`,
    );
  }
  const me: Holder = {
    pid: process.pid,
    host: hostname(),
    since: Date.now(),
    command: process.argv.slice(1).join(' '),
  };
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      const fd = openSync(lockPath, 'wx', 0o600);
      writeSync(fd, JSON.stringify(me));
      closeSync(fd);
      heldHere.add(key);
      let released = false;
      return {
        release() {
          if (released) return;
          released = true;
          heldHere.delete(key);
          if (readHolder(lockPath)?.pid === process.pid) unlinkSync(lockPath);
        },
      };
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'EROFS' || code === 'EACCES' || code === 'EPERM')
        throw readOnly(journalPath, err);
      if (code !== 'EEXIST') throw err;
    }
    const holder = readHolder(lockPath);
    if (holder && holder.host === me.host && holder.pid !== process.pid && isAlive(holder.pid)) {
      throw new JournalError(
        'JOURNAL_BUSY',
        `journal ${journalPath} is being written by pid ${holder.pid} since ${new Date(holder.since).toISOString()} ` +
          `(${holder.command}); one writer at a time — stop it first, or use the read-only commands (rooms, room, journal tail/stats/verify/backup)`,
      );
    }
    if (holder && holder.host !== me.host) {
      throw new JournalError(
        'JOURNAL_BUSY',
        `journal ${journalPath} is locked by pid ${holder.pid} on host ${holder.host}; if that writer is gone, remove ${lockPath}`,
      );
    }
    // The holder died without releasing (kill -9, power loss): take the lock over.
    try {
      unlinkSync(lockPath);
    } catch {
      // another writer removed it first; the next attempt finds out who won
    }
  }
  throw new JournalError(
    'JOURNAL_BUSY',
    `journal ${journalPath}: another writer took the lock at the same moment`,
  );
}
