/** What every CLI command shares: where the journal is, output mode, and exit codes. */
import { accessSync, constants, mkdirSync, readFileSync } from 'node:fs';
import { openJournalReader } from '../app/journal.ts';
import { UsageError } from '../errors.ts';
import { openArchiveReader } from '../journal/archive/segments.ts';
import { type NamedFilter, unknownName } from '../journal/filter-names.ts';
import type { JournalReader } from '../journal/store.ts';

export const DEFAULT_JOURNAL = process.env.PDCTL_JOURNAL || './data/journal.db';

/** Exit codes, documented in `pdctl --help`. */
export const EXIT = {
  ok: 0,
  /** The command ran and found a problem (verify failed, a room not found). */
  problem: 1,
  /** Bad flags or arguments. */
  usage: 2,
  /** The journal could not be opened: missing, corrupt, or of another schema version. */
  journal: 3,
  /** The running server asked (`--url`) could not be reached. */
  unreachable: 4,
  /** Stopped by Ctrl-C or SIGTERM (128 + SIGINT). */
  interrupted: 130,
} as const;

export const VERSION: string = (
  JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as {
    version: string;
  }
).version;

export interface CommonOptions {
  journal: string;
  json?: boolean;
  /** Read the archive retention wrote there instead of the journal (`--archive DIR`). */
  archive?: string;
}

/** `--archive` of the commands that read one. */
export const ARCHIVE_HELP =
  'read the archive that serve --archive or journal prune --archive wrote in DIR (rooms pruned from the journal) instead of the journal';

/**
 * The directory of a writer's `--archive` (serve, journal prune), made if need be: one it cannot
 * write is refused before anything is pruned, saying so.
 */
export function writableArchive(dir: string): string {
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    accessSync(dir, constants.W_OK);
  } catch (err) {
    throw new UsageError(
      `--archive ${dir} cannot be written (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}): nothing would keep what is pruned; pass a directory this user can write, or leave --archive out to prune without keeping`,
    );
  }
  return dir;
}

/**
 * The journal file of `--journal` (or the archive of `--archive`), for reading only. `since`: the
 * question is about what happened from then on, so an archive loads only the segments of rooms
 * that ended from then on (a room is filed under the hour it ended, never before any of its events).
 */
export function openReader(opts: CommonOptions, since?: number): JournalReader {
  return opts.archive !== undefined
    ? openArchiveReader(opts.archive, {
        ...(since === undefined ? {} : { since }),
        onDamage: (d) =>
          note(
            `pdctl: ${d.file}: ${d.bytes} bytes${d.offset >= 0 ? ` at offset ${d.offset}` : ''} skipped, not a whole archive member (${d.why}); the segment's other members are read`,
          ),
      })
    : openJournalReader(opts.journal);
}

/**
 * After a filter of a journal file matched nothing: a name the journal does not hold is a usage
 * error that lists the ones it does (as the query routes answer 400).
 */
export async function refuseUnknownName(reader: JournalReader, filter: NamedFilter): Promise<void> {
  const unknown = await unknownName(reader, filter);
  if (unknown) throw new UsageError(unknown.message);
}

export function print(line: string): void {
  process.stdout.write(`${line}\n`);
}

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

/** Progress and notes go to stderr so that stdout stays clean for pipes and --json. */
export function note(line: string): void {
  process.stderr.write(`${line}\n`);
}
