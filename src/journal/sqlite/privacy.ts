/**
 * Who may read a journal file. It holds request ids, trace context and timings, so what pdctl
 * creates for a journal is its owner's alone: the directory 0700 (when pdctl makes it), the file
 * 0600 (SQLite gives its -wal and -shm the file's mode). A journal found readable by others is
 * reported, with the fix, and left as it is: its modes are the operator's to change.
 */
import { chmodSync, existsSync, mkdirSync, statSync } from 'node:fs';
import { dirname } from 'node:path';

export const PRIVATE_DIR_MODE = 0o700;
export const PRIVATE_FILE_MODE = 0o600;

/** Makes the directory a new journal at `path` goes in (and those above it), owner-only. */
export function makeJournalDir(path: string): void {
  mkdirSync(dirname(path), { recursive: true, mode: PRIVATE_DIR_MODE });
}

/** Makes a journal file pdctl has just created owner-only, before anything is written to it. */
export function makePrivate(path: string): void {
  chmodSync(path, PRIVATE_FILE_MODE);
}

/**
 * What of the journal at `path` others may read — its directory (listing and entering it) and its
 * files — with the commands that make it private; null when nothing.
 */
export function sharedJournal(path: string): { shared: string[]; fix: string } | null {
  const files = [path, `${path}-wal`, `${path}-shm`].filter((f) => existsSync(f));
  const mode = (p: string) => statSync(p).mode & 0o777;
  const shared = [
    ...files.filter((f) => (mode(f) & 0o044) !== 0).map((f) => `${f} (${octal(mode(f))})`),
    ...((mode(dirname(path)) & 0o055) !== 0 && files.some((f) => (mode(f) & 0o044) !== 0)
      ? [`${dirname(path)}/ (${octal(mode(dirname(path)))})`]
      : []),
  ];
  if (shared.length === 0) return null;
  return {
    shared,
    fix: `chmod 600 ${files.join(' ')} && chmod 700 ${dirname(path)}`,
  };
}

function octal(mode: number): string {
  return `0${mode.toString(8).padStart(3, '0')}`;
}
