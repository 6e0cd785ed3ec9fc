/**
 * The journal's read queries over a `MemoryDisk`, answering as the SQL of queries.ts does on
 * SQLite and PostgreSQL (test/helpers/journal-contract.ts holds all three to it).
 */
import type { EventType, JournalEvent, JournalEventOf } from '../../room/events.ts';
import type { Room } from '../../room/reducer.ts';
import type { RoomState } from '../../room/states.ts';
import {
  decodeCursor,
  ENTERS,
  journalNames,
  limitOf,
  minuteCounts,
  releasedByBoth,
  roomPage,
  spansOf,
  tailMatcher,
} from '../queries.ts';
import { roomToParams } from '../rows.ts';
import type {
  EngineBacklog,
  JournalDisk,
  JournalNames,
  JournalReader,
  JournalStats,
  MinuteCount,
  PrunableCount,
  RoomFilter,
  RoomPage,
  StoredCheckpoint,
  TailFilter,
  Timeline,
  VerifyReport,
} from '../store.ts';
import { cursorProblems, type FoldRow, JournalFold, ProjectionCheck } from '../verify.ts';
import { copyEvent, copyRoom, type MemoryDisk } from './disk.ts';

/** The schema an in-memory journal reports: the newest the SQL backends migrate to. */
export const MEMORY_SCHEMA_VERSION = 4;

export class MemoryReader implements JournalReader {
  constructor(protected readonly disk: MemoryDisk) {}

  readFrom(afterSeq: number, limit: number): Promise<JournalEvent[]> {
    return Promise.resolve(this.disk.readFrom(afterSeq, limit));
  }

  engineBacklog(
    engine: string,
    afterSeq: number,
    liveOnly = afterSeq === 0,
  ): Promise<EngineBacklog> {
    const { disk } = this;
    const headSeq = disk.headSeq();
    const ofEngine = (r: Room | undefined) =>
      r !== undefined && (r.prefillEngine === engine || r.decodeEngine === engine);
    const events = disk.events.filter((ev) => {
      if (ev.type === 'room.event_rejected' || ev.room === null || ev.seq > headSeq) return false;
      const room = disk.rooms.get(ev.room);
      // A fresh engine needs the live rooms only (those with a deadline).
      if (liveOnly) return ofEngine(room) && room?.deadlineAt !== null;
      return ev.seq > afterSeq && ofEngine(room);
    });
    return Promise.resolve({ events: events.map(copyEvent), headSeq });
  }

  getCheckpoint(name: string): Promise<StoredCheckpoint | null> {
    const c = this.disk.checkpoints.get(name);
    return Promise.resolve(
      c ? { ...c, currentSchemaVersion: MEMORY_SCHEMA_VERSION, brokenBy: null } : null,
    );
  }

  headSeq(): Promise<number> {
    return Promise.resolve(this.disk.headSeq());
  }

  timeline(room: string): Promise<Timeline> {
    const events = this.disk.events.filter((e) => e.room === room).map(copyEvent);
    const r = this.disk.rooms.get(room);
    return Promise.resolve({ room: r ? copyRoom(r) : null, events, spans: spansOf(events) });
  }

  rooms(filter: RoomFilter): Promise<RoomPage> {
    try {
      const limit = limitOf(filter.limit, 100);
      const cursor = filter.cursor === undefined ? null : decodeCursor(filter.cursor);
      const states =
        filter.state === undefined
          ? null
          : new Set(Array.isArray(filter.state) ? filter.state : [filter.state]);
      const matches = (r: Room): boolean =>
        (states === null || states.has(r.state)) &&
        (filter.engine === undefined ||
          r.prefillEngine === filter.engine ||
          r.decodeEngine === filter.engine) &&
        (filter.reason === undefined || r.reason === filter.reason) &&
        (filter.requestId === undefined || r.requestId === filter.requestId) &&
        (filter.tenant === undefined || r.tenant === filter.tenant) &&
        (filter.until === undefined || r.createdAt <= filter.until) &&
        (filter.since === undefined || r.terminalAt === null || r.terminalAt >= filter.since) &&
        (filter.inFlightAt === undefined ||
          (r.createdAt <= filter.inFlightAt &&
            (r.terminalAt === null || r.terminalAt > filter.inFlightAt))) &&
        (filter.origin === undefined ||
          filter.origin.length === 0 ||
          filter.origin.includes(r.origin)) &&
        (filter.excludeOrigin === undefined || !filter.excludeOrigin.includes(r.origin)) &&
        (!filter.unreleased || !releasedByBoth(r)) &&
        (cursor === null ||
          r.createdAt < cursor[0] ||
          (r.createdAt === cursor[0] && r.room < cursor[1]));
      const rows = [...this.disk.rooms.values()]
        .filter(matches)
        .sort(
          (a, b) => b.createdAt - a.createdAt || (a.room < b.room ? 1 : a.room > b.room ? -1 : 0),
        )
        .slice(0, limit + 1)
        .map(copyRoom);
      return Promise.resolve(roomPage(rows, limit));
    } catch (err) {
      return Promise.reject(err);
    }
  }

  perMinute(window: { since: number; until: number }): Promise<MinuteCount[]> {
    const groups = new Map<
      string,
      { minute: number; type: string; reason: string | null; count: number }
    >();
    for (const ev of this.disk.events) {
      if (ev.ts < window.since || ev.ts >= window.until || !(ev.type in ENTERS)) continue;
      const minute = Math.floor(ev.ts / 60_000) * 60_000;
      const reason =
        ev.type === 'room.failed' || ev.type === 'room.aborted' ? ev.data.reason : null;
      const key = `${minute}\u0000${ev.type}\u0000${reason}`;
      const g = groups.get(key) ?? { minute, type: ev.type, reason, count: 0 };
      g.count++;
      groups.set(key, g);
    }
    return Promise.resolve(minuteCounts([...groups.values()]));
  }

  tail<T extends EventType = EventType>(filter: TailFilter<T>): Promise<JournalEventOf<T>[]> {
    try {
      const limit = limitOf(filter.limit, 50);
      const matches = tailMatcher(filter);
      const from = this.disk.indexAfter(filter.afterSeq ?? 0);
      const events = this.disk.events;
      const out: JournalEvent[] = [];
      if ((filter.order ?? 'newest') === 'newest') {
        for (let i = events.length - 1; i >= from && out.length < limit; i--) {
          const ev = events[i] as JournalEvent;
          if (matches(ev)) out.push(ev);
        }
        out.reverse();
      } else {
        for (let i = from; i < events.length && out.length < limit; i++) {
          const ev = events[i] as JournalEvent;
          if (matches(ev)) out.push(ev);
        }
      }
      return Promise.resolve(out.map(copyEvent) as JournalEventOf<T>[]);
    } catch (err) {
      return Promise.reject(err);
    }
  }

  stats(): Promise<JournalStats> {
    const { disk } = this;
    const byState: Partial<Record<RoomState, number>> = {};
    const failuresByReason: Record<string, number> = {};
    const abortsByReason: Record<string, number> = {};
    for (const r of disk.rooms.values()) {
      byState[r.state] = (byState[r.state] ?? 0) + 1;
      const into =
        r.state === 'failed' ? failuresByReason : r.state === 'aborted' ? abortsByReason : null;
      if (into && r.reason !== null) into[r.reason] = (into[r.reason] ?? 0) + 1;
    }
    const eventsByType: Record<string, number> = {};
    const refusalsByReason: Record<string, number> = {};
    let firstTs: number | null = null;
    // The journal's size: what its committed events take as JSON.
    let bytes = 0;
    let lastTs: number | null = null;
    for (const ev of disk.events) {
      eventsByType[ev.type] = (eventsByType[ev.type] ?? 0) + 1;
      bytes += JSON.stringify(ev).length;
      firstTs = firstTs === null ? ev.ts : Math.min(firstTs, ev.ts);
      lastTs = lastTs === null ? ev.ts : Math.max(lastTs, ev.ts);
      if (ev.type === 'request.refused') {
        const { reason, count } = ev.data as { reason: string; count: number };
        refusalsByReason[reason] = (refusalsByReason[reason] ?? 0) + count;
      }
    }
    return Promise.resolve({
      path: disk.name,
      schemaVersion: MEMORY_SCHEMA_VERSION,
      events: disk.events.length,
      firstSeq: disk.events[0]?.seq ?? null,
      lastSeq: disk.events.at(-1)?.seq ?? null,
      firstTs,
      lastTs,
      rooms: disk.rooms.size,
      byState,
      failuresByReason: byCount(failuresByReason),
      abortsByReason: byCount(abortsByReason),
      refusalsByReason: byCount(refusalsByReason),
      rejectedEvents: eventsByType['room.event_rejected'] ?? 0,
      eventsByType: byCount(eventsByType),
      consumers: [...disk.consumers]
        .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
        .map(([name, c]) => ({ name, seq: c.seq, updatedAt: c.updatedAt })),
      fileBytes: bytes,
      ...(disk.leadership.terms.length > 0
        ? { leaders: disk.leadership.terms.map((t) => ({ ...t })) }
        : {}),
    });
  }

  names(): Promise<JournalNames> {
    const engines = new Set<string>();
    const reasons = new Set<string>();
    for (const r of this.disk.rooms.values()) {
      engines.add(r.prefillEngine).add(r.decodeEngine);
      if (r.reason !== null) reasons.add(r.reason);
    }
    for (const e of this.disk.events) if (e.engine !== null) engines.add(e.engine);
    return Promise.resolve(journalNames(engines, reasons));
  }

  diskUsage(): Promise<JournalDisk> {
    let bytes = 0;
    for (const ev of this.disk.events) bytes += JSON.stringify(ev).length;
    return Promise.resolve({ bytes, freeBytes: null });
  }

  countPrunable(cutoffTs: number, eventsCutoffTs?: number): Promise<PrunableCount> {
    const rooms = new Set(this.disk.prunable(cutoffTs).map((r) => r.room));
    const events = this.disk.events.filter((e) => e.room !== null && rooms.has(e.room)).length;
    const others =
      eventsCutoffTs === undefined
        ? 0
        : this.disk.events.filter((e) => this.disk.isOther(e, eventsCutoffTs)).length;
    return Promise.resolve({ rooms: rooms.size, events, otherEvents: others });
  }

  verify(): Promise<VerifyReport> {
    const started = process.hrtime.bigint();
    const fold = new JournalFold();
    fold.add(
      this.disk.events.map(
        (e): FoldRow => [e.seq, e.ts, e.type, e.room, e.engine, e.source, JSON.stringify(e.data)],
      ),
    );
    const check = new ProjectionCheck(fold);
    for (const room of this.disk.rooms.values()) check.row(roomToParams(room));
    const problems = cursorProblems(
      [...this.disk.consumers].map(([name, c]) => ({ name, seq: c.seq })),
      this.disk.lastSeq,
    );
    return Promise.resolve(check.report('in memory: no storage to check', problems, started));
  }

  close(): void {}
}

/** Counts, the largest first (as `ORDER BY n DESC`). */
function byCount(counts: Record<string, number>): Record<string, number> {
  return Object.fromEntries(Object.entries(counts).sort(([, a], [, b]) => b - a));
}
