/** One-line human summaries of events and rooms for the CLI's tables. */
import type { JournalEvent } from '../journal/events.ts';
import type { Room } from '../journal/reducer.ts';
import { formatDuration } from '../time.ts';

type D = Record<string, unknown>;

export function describeEvent(ev: JournalEvent): string {
  const d = ev.data as D;
  switch (ev.type) {
    case 'room.created':
      return `${d.prefillEngine} → ${d.decodeEngine}, prompt ${d.promptTokens ?? '?'} tok, max ${d.maxTokens ?? '?'}${d.migratedFrom ? `, migrated from ${d.migratedFrom}` : ''}${d.requestId ? `, request ${d.requestId}` : ''}`;
    case 'room.bootstrapped':
      return `${(d.pages as unknown[]).length} pages reserved${d.epoch !== undefined ? `, epoch ${d.epoch}` : ''}`;
    case 'room.transfer_posted':
      return d.pairs !== undefined
        ? `${d.pairs} page pairs${d.bytes !== undefined ? `, ${d.bytes} B` : ''}`
        : '';
    case 'room.transfer_completed':
      return `${d.bytes} B in ${formatDuration((d.micros as number) / 1000)}, checksum ${d.checksum}`;
    case 'room.completed':
      return `${d.tokens} tokens, ${d.finishReason}`;
    case 'room.aborted':
      return `${d.reason} (from ${d.source})`;
    case 'room.failed':
      return `${d.reason} in ${d.stage}, detected by ${d.detectedBy}`;
    case 'room.migrated':
      return `continues in ${d.toRoom}${d.detail ? ` (${d.detail})` : d.reason ? ` (${d.reason})` : ''}`;
    case 'room.abort_requested':
      return String(d.reason);
    case 'room.released':
      return `${ev.engine} freed ${d.pages !== undefined ? `${d.pages} pages` : 'its pages'}`;
    case 'room.event_rejected':
      return `${d.eventType} rejected: ${d.reason}${d.state ? ` (room was ${d.state})` : ''}`;
    case 'journal.opened':
      return `schema ${d.schemaVersion}, durability ${d.durability}, pid ${d.pid}, pdctl ${d.version}`;
    case 'journal.pruned':
      return `${d.rooms} rooms, ${d.events} events ended before ${new Date(d.cutoffTs as number).toISOString()}`;
    case 'recovery.action':
      return `${d.action}: ${d.reason} → ${d.outcome}`;
    case 'request.refused': {
      const ids = d.requestIds as string[];
      return `${d.count} × ${d.status} ${d.reason}${ids.length ? ` (requests ${ids.slice(0, 3).join(', ')}${(d.count as number) > 3 ? ', …' : ''})` : ''}: ${d.message}`;
    }
    case 'engine.registered':
      return `${d.role}, incarnation ${d.incarnation}`;
    case 'engine.stalled':
    case 'engine.lost':
    case 'engine.recovered':
    case 'engine.restarted': {
      const { reason, ...rest } = d;
      const extra = Object.entries(rest).map(
        ([k, v]) => `${k} ${typeof v === 'string' ? v : JSON.stringify(v)}`,
      );
      return [String(reason), ...extra].join(', ');
    }
    default: {
      const s = JSON.stringify(d);
      return s === '{}' ? '' : s.length > 100 ? `${s.slice(0, 97)}...` : s;
    }
  }
}

/** Why a room ended, or what it is waiting for. */
export function roomOutcome(r: Room): string {
  switch (r.state) {
    case 'completed':
      return `${r.tokens} tok, ${r.finishReason}`;
    case 'failed':
      return `${r.reason} in ${r.failedStage}`;
    case 'aborted':
      return `${r.reason}`;
    case 'migrated':
      return `→ ${r.migratedTo}`;
    default:
      return r.abortRequestedAt !== null ? `abort requested (${r.abortReason})` : '';
  }
}
