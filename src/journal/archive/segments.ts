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
 * A member is written whole or not at all: a write that comes up short or fails (a full disk)
 * cuts the segment back to what it held and throws, so the chunk stays in the journal and the
 * next pass archives it again. A member torn by a crash mid-write is skipped by the readers —
 * each member is read on its own, checked by its CRC — never the rest of its segment.
 *
 * A chunk archived and then not deleted (the process died between) is archived again by the next
 * pass: readers keep one copy of each event (by seq) and the last of each room.
 */
import { join } from 'node:path';
import { crc32, gzipSync, inflateRawSync } from 'node:zlib';
import { type Files, nodeFiles } from '../../ports/files.ts';
import type { JournalEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import { JournalError } from '../errors.ts';
import { MemoryDisk } from '../memory/disk.ts';
import { MemoryReader } from '../memory/reader.ts';
import type { ArchiveChunk, JournalReader } from '../store.ts';

export const ARCHIVE_VERSION = 1;
const NAME = /^pdctl-archive-(\d{4}-\d{2}-\d{2}T\d{2})\.jsonl\.gz$/;

/** The segment a time falls in: its UTC hour. */
export function segmentName(ts: number): string {
  return `pdctl-archive-${new Date(ts).toISOString().slice(0, 13)}.jsonl.gz`;
}

/**
 * Writes a chunk to the segments of its hours, each as a gzip member of its own, fsynced
 * before it returns: what it returned for may be deleted from the journal. A segment it could
 * not write whole is cut back to what it held, and it throws (JOURNAL_WRITE_FAILED).
 */
export function archiveChunk(
  dir: string,
  chunk: ArchiveChunk,
  now = Date.now(),
  files: Files = nodeFiles,
): void {
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
  try {
    files.mkdirp(dir);
  } catch (err) {
    throw new JournalError(
      'JOURNAL_WRITE_FAILED',
      `the archive directory ${dir} cannot be made (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}); nothing was pruned: make it writable and the next pass archives the chunk`,
    );
  }
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
    appendMember(files, join(dir, name), gzipSync(`${lines.join('\n')}\n`));
  }
}

/**
 * Appends one member whole and syncs it. A write that comes up short is not a success: on any
 * failure the segment is cut back to its length before, so no torn member is left behind it.
 */
function appendMember(files: Files, path: string, member: Buffer): void {
  let file: ReturnType<Files['openAppend']>;
  try {
    file = files.openAppend(path);
  } catch (err) {
    throw archiveWriteFailed(path, err, 0, member.length, 'nothing was written');
  }
  let written = 0;
  try {
    while (written < member.length) {
      const n = file.write(member.subarray(written));
      if (!(n > 0)) throw Object.assign(new Error('no byte written'), { code: 'ENOSPC' });
      written += n;
    }
    file.sync();
  } catch (err) {
    let after = `the segment was cut back to its ${file.size} bytes before`;
    try {
      file.truncate(file.size);
      file.sync();
    } catch (cut) {
      after = `cutting the segment back failed too (${(cut as NodeJS.ErrnoException).code ?? (cut as Error).message}): readers skip its torn tail`;
    }
    throw archiveWriteFailed(path, err, written, member.length, after);
  } finally {
    file.close();
  }
}

function archiveWriteFailed(
  path: string,
  err: unknown,
  written: number,
  bytes: number,
  after: string,
): JournalError {
  const code = (err as NodeJS.ErrnoException).code ?? (err as Error).message;
  return new JournalError(
    'JOURNAL_WRITE_FAILED',
    `archive segment ${path}: ${code} after ${written} of ${bytes} bytes; ${after}. Nothing of this chunk was deleted from the journal: free room on the archive's disk and the next pass archives it`,
  );
}

/** Where to read an archive from: its window of hours, its file system, who hears of damage. */
export interface ArchiveRead {
  since?: number;
  until?: number;
  files?: Files;
  /** Told of each stretch of a segment skipped as damaged (default: nobody). */
  onDamage?: (damage: ArchiveDamage) => void;
}

/** A stretch of a segment that holds no readable member: a torn tail, or damage. */
export interface ArchiveDamage {
  file: string;
  offset: number;
  bytes: number;
  why: string;
}

/** The segment files of `dir`, oldest first; within `[since, until]` (by hour) when given. */
export function segmentFiles(dir: string, read: ArchiveRead = {}): string[] {
  let names: string[];
  try {
    names = (read.files ?? nodeFiles).readdir(dir);
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
        (read.since === undefined || start + hourMs > read.since) &&
        (read.until === undefined || start <= read.until)
      );
    })
    .sort()
    .map((n) => join(dir, n));
}

/**
 * The members of a segment, each read on its own and checked by its CRC and length, and the
 * stretches that are no whole member: one torn by a crash (whole ones may follow it), or damage.
 * A stretch that is not one is skipped up to the next gzip magic after its start.
 */
export function segmentMembers(bytes: Buffer): {
  texts: string[];
  damaged: Array<{ offset: number; bytes: number; why: string }>;
} {
  const texts: string[] = [];
  const damaged: Array<{ offset: number; bytes: number; why: string }> = [];
  for (let at = 0; at < bytes.length; ) {
    const member = readMember(bytes, at);
    if ('text' in member) {
      texts.push(member.text);
      at = member.end;
      continue;
    }
    const next = bytes.indexOf(GZIP_MAGIC, at + 1);
    const end = next < 0 ? bytes.length : next;
    damaged.push({ offset: at, bytes: end - at, why: member.why });
    at = end;
  }
  return { texts, damaged };
}

const GZIP_MAGIC = Buffer.from([0x1f, 0x8b, 0x08]);
const [FHCRC, FEXTRA, FNAME, FCOMMENT] = [2, 4, 8, 16];

/** The gzip member at `at` (RFC 1952): its text and where it ends, or why it is none. */
function readMember(bytes: Buffer, at: number): { text: string; end: number } | { why: string } {
  if (bytes.indexOf(GZIP_MAGIC, at) !== at) return { why: 'not a gzip member' };
  const flags = bytes[at + 3] ?? 0;
  let body = at + 10;
  if (flags & FEXTRA) body += 2 + (bytes.readUInt16LE(Math.min(body, bytes.length - 2)) || 0);
  for (const flag of [FNAME, FCOMMENT])
    if (flags & flag) body = bytes.indexOf(0, body) + 1 || bytes.length;
  if (flags & FHCRC) body += 2;
  let out: Buffer;
  let used: number;
  try {
    const r = inflateRawSync(bytes.subarray(body), { info: true }) as unknown as {
      buffer: Buffer;
      engine: { bytesWritten: number };
    };
    out = r.buffer;
    used = r.engine.bytesWritten;
  } catch (err) {
    return { why: `a torn or damaged member (${(err as Error).message})` };
  }
  const trailer = body + used;
  if (trailer + 8 > bytes.length) return { why: 'a torn member (its trailer is missing)' };
  if (
    bytes.readUInt32LE(trailer) !== crc32(out) ||
    bytes.readUInt32LE(trailer + 4) !== out.length >>> 0
  )
    return { why: 'a damaged member (its CRC or length does not match)' };
  return { text: out.toString('utf8'), end: trailer + 8 };
}

/**
 * Every segment of `dir` (in the window) as an in-memory journal a `MemoryReader` answers from.
 * A segment of a newer archive version is refused, as a newer journal is. A stretch of a
 * segment that is not a whole member (torn, damaged) is skipped and told to `onDamage`; the
 * segment's other members are read.
 */
export function loadArchive(dir: string, read: ArchiveRead = {}): MemoryDisk {
  const files = read.files ?? nodeFiles;
  const disk = new MemoryDisk(`archive ${dir}`);
  const events = new Map<number, JournalEvent>();
  const damage = (d: ArchiveDamage) => read.onDamage?.(d);
  for (const file of segmentFiles(dir, read)) {
    let bytes: Buffer;
    try {
      bytes = files.readFile(file);
    } catch (err) {
      throw new JournalError(
        'JOURNAL_CORRUPT',
        `${file} cannot be read (${(err as NodeJS.ErrnoException).code ?? (err as Error).message}); move it aside to read the others`,
      );
    }
    const { texts, damaged } = segmentMembers(bytes);
    for (const d of damaged) damage({ file, ...d });
    for (const text of texts) {
      const rows = memberRows(text);
      if (typeof rows === 'string') {
        damage({ file, offset: -1, bytes: text.length, why: rows });
        continue;
      }
      for (const row of rows) {
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
  }
  for (const ev of [...events.values()].sort((a, b) => a.seq - b.seq)) disk.add(ev);
  disk.lastSeq = disk.events.at(-1)?.seq ?? 0;
  return disk;
}

type Row = { pdctl?: string; version?: number; room?: Room; event?: JournalEvent };

/** A member's rows, or why it is not one this code wrote (then none of it is read). */
function memberRows(text: string): Row[] | string {
  const rows: Row[] = [];
  for (const [i, line] of text.split('\n').entries()) {
    if (line === '') continue;
    try {
      rows.push(JSON.parse(line) as Row);
    } catch {
      return `a member's line ${i + 1} is not JSON`;
    }
  }
  return rows;
}

/** The archive in `dir` (its segments in the window) as a journal reader: read-only, in memory. */
export function openArchiveReader(dir: string, read: ArchiveRead = {}): JournalReader {
  return new MemoryReader(loadArchive(dir, read));
}
