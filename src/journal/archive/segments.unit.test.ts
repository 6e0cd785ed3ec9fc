/** The archive's segment files: one per hour, appended chunk by chunk, read back as a journal. */
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gunzipSync, gzipSync } from 'node:zlib';
import { describe, expect, it } from 'vitest';
import { tempDir } from '../../../test/helpers/tmp.ts';
import { openReader } from '../../cli/context.ts';
import type { JournalEvent } from '../events.ts';
import type { Room } from '../reducer.ts';
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

  it('refuses a newer archive version, a damaged segment and a missing directory, saying what to do', () => {
    const dir = tempDir('pdctl-segments-');
    const newer = `${JSON.stringify({ pdctl: 'archive', version: 2 })}\n`;
    writeFileSync(join(dir, segmentName(T0)), gzipSync(newer));
    expect(() => loadArchive(dir)).toThrow(
      expect.objectContaining({ code: 'JOURNAL_VERSION_CONFLICT' }),
    );
    writeFileSync(join(dir, segmentName(T0)), 'not gzip');
    expect(() => loadArchive(dir)).toThrow(/not a readable archive segment.*move it aside/);
    expect(() => loadArchive(join(dir, 'nope'))).toThrow(
      expect.objectContaining({ code: 'JOURNAL_NOT_FOUND' }),
    );
  });
});
