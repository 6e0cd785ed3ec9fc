/**
 * How `journal backup` and `journal export` write their output: into a private directory they
 * create next to it (mkdtemp: a new name, mode 0700, nobody else's), then linked into place only
 * when whole. Nothing at the output's path is followed or deleted: a symlink planted there, or
 * at the old `OUT.partial`, is never written through. Without --force an existing path is
 * refused; with it, the new file replaces the path itself (a symlink is replaced, not followed).
 * Every failure is one line that says what to do.
 */
import { linkSync, lstatSync, mkdtempSync, renameSync, rmSync } from 'node:fs';
import { basename, dirname, join, resolve } from 'node:path';
import { UsageError } from '../../errors.ts';
import { JournalError } from '../../journal/errors.ts';
import { classifySqliteError } from '../../journal/sqlite/open.ts';

/** Runs `produce(tmp)` to write the file at `tmp`, then puts it at `to`. */
export async function writeNewFile(
  to: string,
  opts: { force?: boolean; journal: string },
  produce: (tmp: string) => Promise<void>,
): Promise<void> {
  refuseExisting(to, opts.force === true);
  let work: string;
  try {
    work = mkdtempSync(join(dirname(resolve(to)), `.${basename(to)}.partial-`));
  } catch (err) {
    throw cannotWrite(to, err);
  }
  try {
    const tmp = join(work, basename(to));
    try {
      await produce(tmp);
    } catch (err) {
      const e = classifySqliteError(err, opts.journal);
      if (e instanceof JournalError || e instanceof UsageError) throw e;
      throw cannotWrite(to, err);
    }
    try {
      if (opts.force) renameSync(tmp, to);
      else linkSync(tmp, to);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EEXIST') refuseExisting(to, false);
      throw cannotWrite(to, err);
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

function refuseExisting(to: string, force: boolean): void {
  let st: ReturnType<typeof lstatSync>;
  try {
    st = lstatSync(to);
  } catch {
    return;
  }
  if (st.isDirectory()) throw new UsageError(`${to} is a directory; name the file to write`);
  if (!force) {
    throw new UsageError(
      `${to} already exists${st.isSymbolicLink() ? ' (a symbolic link)' : ''}; pick another name or pass --force to replace it`,
    );
  }
}

function cannotWrite(to: string, err: unknown): UsageError {
  const e = err as NodeJS.ErrnoException;
  return new UsageError(
    `cannot write ${to} (${e.code ? `${e.code}: ` : ''}${e.message ?? String(err)}); pick a directory you can write, with room for the file`,
  );
}
