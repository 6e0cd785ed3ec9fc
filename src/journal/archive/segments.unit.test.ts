/** The archive's segment files: one per hour, appended chunk by chunk, read back as a journal. */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { openReader } from '../../cli/context.ts';
import { type FileFault, MemoryFiles } from '../../ports/files.ts';
import type { JournalEvent } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import { archiveChunk, loadArchive, openArchiveReader, segmentName } from './segments.ts';

const HOUR = 3_600_000;
const T0 = Date.UTC(2026, 11, 4, 3, 10);

function room(name: string, terminalAt: number): Room {
  const fields = { releasedBy: [], deadlinesMs: {}, createdAt: terminalAt - 1000 };
  return {
    room: name,
    state: 'completed',
    terminalAt,
    updatedAt: terminalAt,
    ...fields,
  } as unknown as Room;
}

function event(seq: number, roomName: string | null, ts: number): JournalEvent {
  return {
    seq,
    ts,
    type: roomName ? 'room.completed' : 'engine.stalled',
    room: roomName,
    engine: roomName ? null : 'd0',
    source: 'test',
    eventId: `e-${seq}`,
    data: roomName ? { tokens: 1 } : { reason: 'x' },
  } as JournalEvent;
}

describe('archive segments', () => {
  it('writes each room with its events to the hour it ended, events of no room to theirs', () => {
    const dir = tempDir('pdctl-segments-');
    archiveChunk(dir, {
      rooms: [room('a', T0), room('b', T0 + HOUR)],
      // b's event is from the hour before it ended: it goes with b.
      events: [event(1, 'a', T0), event(2, 'b', T0), event(3, null, T0 + 2 * HOUR)],
    });
    expect(readdirSync(dir).sort()).toEqual([
      'pdctl-archive-2026-12-04T03.jsonl.gz',
      'pdctl-archive-2026-12-04T04.jsonl.gz',
      'pdctl-archive-2026-12-04T05.jsonl.gz',
    ]);
    expect(segmentName(T0)).toBe('pdctl-archive-2026-12-04T03.jsonl.gz');
    const first = gunzipSync(readFileSync(join(dir, segmentName(T0))))
      .toString()
      .split('\n');
    expect(JSON.parse(first[0] as string)).toMatchObject({
      pdctl: 'archive',
      version: 1,
      rooms: 1,
      events: 1,
    });
    const second = loadArchive(dir, { since: T0 + HOUR, until: T0 + HOUR });
    expect([...second.rooms.keys()]).toEqual(['b']);
    expect(second.events.map((e) => e.seq)).toEqual([2]);
  });

  it('a question from a time on (the CLI --since) loads only the segments of rooms that ended since', async () => {
    const dir = tempDir('pdctl-segments-');
    archiveChunk(dir, {
      rooms: [room('a', T0), room('b', T0 + HOUR)],
      events: [event(1, 'a', T0), event(2, 'b', T0), event(3, 'b', T0 + HOUR)],
    });
    const reader = openReader({ journal: 'unused', archive: dir }, T0 + HOUR - 60_000);
    const page = await reader.rooms({ since: T0 + HOUR - 60_000 });
    expect(page.rooms.map((r) => r.room)).toEqual(['b']);
    // b's first event is older than since; it is filed with b, and b is loaded whole.
    expect((await reader.timeline('b')).events.map((e) => e.seq)).toEqual([2, 3]);
    expect((await reader.timeline('a')).room).toBeNull();
    expect(
      (await openReader({ journal: 'unused', archive: dir }).timeline('a')).room,
    ).not.toBeNull();
  });

  it('keeps one copy of a chunk archived twice, and reads it as a journal', async () => {
    const dir = tempDir('pdctl-segments-');
    const chunk = { rooms: [room('a', T0)], events: [event(1, 'a', T0), event(4, 'a', T0)] };
    archiveChunk(dir, chunk);
    archiveChunk(dir, chunk);
    const reader = openArchiveReader(dir);
    expect((await reader.timeline('a')).events.map((e) => e.seq)).toEqual([1, 4]);
    expect(await reader.headSeq()).toBe(4);
  });

  it('refuses a newer archive version and a missing directory, saying what to do', () => {
    const dir = tempDir('pdctl-segments-');
    const newer = `${JSON.stringify({ pdctl: 'archive', version: 2 })}\n`;
    writeFileSync(join(dir, segmentName(T0)), gzipSync(newer));
    expect(() => loadArchive(dir)).toThrow(
      expect.objectContaining({ code: 'JOURNAL_VERSION_CONFLICT' }),
    );
    expect(() => loadArchive(join(dir, 'nope'))).toThrow(
      expect.objectContaining({ code: 'JOURNAL_NOT_FOUND' }),
    );
  });

  it('skips what is not a whole member — a torn one, damage, garbage — and reads every other', () => {
    const dir = tempDir('pdctl-segments-');
    const path = join(dir, segmentName(T0));
    archiveChunk(dir, { rooms: [room('a', T0)], events: [event(1, 'a', T0)] });
    const first = readFileSync(path);
    archiveChunk(dir, { rooms: [room('b', T0)], events: [event(2, 'b', T0)] });
    const second = readFileSync(path).subarray(first.length);
    const third = gzipSync(`${JSON.stringify({ room: room('c', T0) })}\n`);
    const flipped = Buffer.from(second);
    flipped[flipped.length - 12] = (flipped[flipped.length - 12] as number) ^ 0xff;
    const damaged: string[] = [];
    const read = (bytes: Buffer) => {
      writeFileSync(path, bytes);
      damaged.length = 0;
      return [...loadArchive(dir, { onDamage: (d) => damaged.push(d.why) }).rooms.keys()].sort();
    };
    // A member torn by a crash, at the end and with a whole one after it.
    expect(read(Buffer.concat([first, second.subarray(0, 30)]))).toEqual(['a']);
    expect(damaged).toHaveLength(1);
    expect(read(Buffer.concat([first, second.subarray(0, 30), third]))).toEqual(['a', 'c']);
    expect(damaged).toHaveLength(1);
    // A flipped bit inside a member: its CRC refuses it, its neighbours are read.
    expect(read(Buffer.concat([first, flipped, third]))).toEqual(['a', 'c']);
    expect(damaged).toHaveLength(1);
    // Not gzip at all.
    expect(read(Buffer.from('not gzip'))).toEqual([]);
    expect(damaged).toEqual(['not a gzip member']);
    expect(read(Buffer.concat([first, second]))).toEqual(['a', 'b']);
    expect(damaged).toEqual([]);
  });

  it('a write that comes up short or fails leaves the segment as it was and throws', () => {
    const files = new MemoryFiles();
    const dir = '/archive';
    const chunk = (name: string) => ({ rooms: [room(name, T0)], events: [event(1, name, T0)] });
    archiveChunk(dir, chunk('a'), T0, files);
    const path = `${dir}/${segmentName(T0)}`;
    const before = files.readFile(path);
    const faults: FileFault[] = [{ short: 7 }, { code: 'ENOSPC' }];
    for (const fault of faults) {
      let writes = 0;
      // The first write goes short (the disk filled); the writer tries the rest and fails.
      files.fault = (op) =>
        op === 'write' && writes++ === 0 ? fault : op === 'write' ? { code: 'ENOSPC' } : null;
      expect(() => archiveChunk(dir, chunk('b'), T0, files)).toThrow(
        /ENOSPC after \d+ of \d+ bytes; the segment was cut back to its \d+ bytes before\. Nothing of this chunk was deleted/,
      );
      expect(files.readFile(path)).toEqual(before);
    }
    // Killed after its write and before its sync: whatever part of the member the crash kept,
    // the segment reads, and the next chunk appended after the torn one reads too.
    const member = gzipSync(`${JSON.stringify({ room: room('c', T0) })}\n`);
    for (let keep = 1; keep < member.length; keep += 9) {
      const crashed = new MemoryFiles();
      archiveChunk(dir, chunk('a'), T0, crashed);
      crashed.openAppend(path).write(member);
      crashed.crash((synced) => synced + keep);
      expect([...loadArchive(dir, { files: crashed }).rooms.keys()]).toEqual(['a']);
      archiveChunk(dir, chunk('d'), T0, crashed);
      expect([...loadArchive(dir, { files: crashed }).rooms.keys()].sort()).toEqual(['a', 'd']);
    }
  });
});
