/**
 * The journal's archive (`--archive DIR`): what retention prunes, written first to compressed,
 * self-describing segment files, one per UTC hour of the rooms' ends (events of no room: of
 * their time), so a question about last month still has an answer on cheap storage.
 *
 * A segment `pdctl-archive-2026-12-04T03.jsonl.gz` is a run of gzip members, one per pruned
 * chunk, appended and fsynced before the chunk is deleted. Each member is JSON lines: a header
 * `{"pdctl":"archive","version":1,…}`, then `{"room":{…}}` for each room (its projection) and
 * `{"event":{…}}` for each event, as the journal's readers give them. `zcat FILE | jq` reads one
 * by hand; `pdctl journal tail|rooms|room|stats --archive DIR` read them all like a journal.
 *
 * A chunk archived and then not deleted (the process died between) is archived again by the next
 * pass: readers keep one copy of each event (by seq) and the last of each room.
 */
import {
  closeSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { JournalError } from '../errors.ts';
import type { JournalEvent } from '../events.ts';
import { MemoryDisk } from '../memory/disk.ts';
import { MemoryReader } from '../memory/reader.ts';
import type { Room } from '../reducer.ts';
import type { ArchiveChunk, JournalReader } from '../store.ts';

export const ARCHIVE_VERSION = 1;
const NAME = /^pdctl-archive-(\d{4}-\d{2}-\d{2}T\d{2})\.jsonl\.gz$/;

/** The segment a time falls in: its UTC hour. */
export function segmentName(ts: number): string {
  return `pdctl-archive-${new Date(ts).toISOString().slice(0, 13)}.jsonl.gz`;
}

/**
 * Writes a chunk to the segments of its hours, each as a gzip member of its own, fsynced
 * before it returns: what it returned for may be deleted from the journal.
 */
export function archiveChunk(dir: string, chunk: ArchiveChunk, now = Date.now()): void {
  const byHour = new Map<string, ArchiveChunk>();
  const into = (ts: number) => {
    const name = segmentName(ts);
    const c = byHour.get(name) ?? { rooms: [], events: [] };
    byHour.set(name, c);
    return c;
  };
  const hourOf = new Map<string, number>();
  for (const room of chunk.rooms) {
    const ended = room.terminalAt ?? room.updatedAt;
    hourOf.set(room.room, ended);
    into(ended).rooms.push(room);
  }
  for (const ev of chunk.events) {
    const ended = ev.room === null ? undefined : hourOf.get(ev.room);
    into(ended ?? ev.ts).events.push(ev);
  }
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  for (const [name, c] of byHour) {
    const header = {
      pdctl: 'archive',
      version: ARCHIVE_VERSION,
      writtenAt: now,
      rooms: c.rooms.length,
      events: c.events.length,
    };
    const lines = [
      JSON.stringify(header),
      ...c.rooms.map((room) => JSON.stringify({ room })),
      ...c.events.map((event) => JSON.stringify({ event })),
    ];
    const fd = openSync(join(dir, name), 'a', 0o600);
    try {
      writeSync(fd, gzipSync(`${lines.join('\n')}\n`));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  }
}

/** The segment files of `dir`, oldest first; within `[since, until]` (by hour) when given. */
export function segmentFiles(
  dir: string,
  window: { since?: number; until?: number } = {},
): string[] {
  let names: string[];
  try {
    names = readdirSync(dir);
  } catch (err) {
    throw new JournalError(
      'JOURNAL_NOT_FOUND',
      `no archive at ${dir} (${(err as NodeJS.ErrnoException).code}): pass the directory pdctl serve --archive or journal prune --archive wrote`,
    );
  }
  const hourMs = 3_600_000;
  return names
    .filter((n) => {
      const m = NAME.exec(n);
      if (!m) return false;
      const start = Date.parse(`${m[1]}:00:00Z`);
      return (
        (window.since === undefined || start + hourMs > window.since) &&
        (window.until === undefined || start <= window.until)
      );
    })
    .sort()
    .map((n) => join(dir, n));
}

/**
 * Every segment of `dir` (in the window) as an in-memory journal a `MemoryReader` answers from.
 * A segment of a newer archive version is refused, as a newer journal is; a damaged one too.
 */
export function loadArchive(
  dir: string,
  window: { since?: number; until?: number } = {},
): MemoryDisk {
  const disk = new MemoryDisk(`archive ${dir}`);
  const events = new Map<number, JournalEvent>();
  for (const file of segmentFiles(dir, window)) {
    let text: string;
    try {
      text = gunzipSync(readFileSync(file)).toString('utf8');
    } catch (err) {
      throw new JournalError(
        'JOURNAL_CORRUPT',
        `${file} is not a readable archive segment (${(err as Error).message}); move it aside to read the others`,
      );
    }
    for (const [i, line] of text.split('\n').entries()) {
      if (line === '') continue;
      let row: { pdctl?: string; version?: number; room?: Room; event?: JournalEvent };
      try {
        row = JSON.parse(line) as typeof row;
      } catch {
        throw new JournalError('JOURNAL_CORRUPT', `${file} line ${i + 1} is not JSON`);
      }
      if (row.pdctl === 'archive') {
        if ((row.version ?? 0) > ARCHIVE_VERSION)
          throw new JournalError(
            'JOURNAL_VERSION_CONFLICT',
            `${file} is archive version ${row.version}, but this pdctl reads up to ${ARCHIVE_VERSION}: read it with the pdctl that wrote it`,
          );
      } else if (row.room) disk.rooms.set(row.room.room, row.room);
      else if (row.event) events.set(row.event.seq, row.event);
    }
  }
  for (const ev of [...events.values()].sort((a, b) => a.seq - b.seq)) disk.add(ev);
  disk.lastSeq = disk.events.at(-1)?.seq ?? 0;
  return disk;
}

/** The archive in `dir` (its segments in the window) as a journal reader: read-only, in memory. */
export function openArchiveReader(
  dir: string,
  window: { since?: number; until?: number } = {},
): JournalReader {
  return new MemoryReader(loadArchive(dir, window));
}
