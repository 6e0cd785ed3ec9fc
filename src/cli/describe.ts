/** One-line human summaries of events and rooms for the CLI's tables. */
import type { JournalEvent, JournalEventOf } from '../room/events.ts';
import type { Room } from '../room/reducer.ts';
import { formatDuration, formatTs } from '../time.ts';

/**
 * For an id found nowhere: the refused requests counted without their ids (more than 100,000
 * waited while the journal refused writes: api/refusals.ts), which it may be one of; null when
 * every refusal kept its ids.
 */
export function describeUnkept(
  refusals: readonly JournalEventOf<'request.refused'>[],
): string | null {
  let count = 0;
  let from = Number.POSITIVE_INFINITY;
  let to = 0;
  for (const { data } of refusals) {
    const unkept = data.count - data.requestIds.length;
    if (unkept <= 0) continue;
    count += unkept;
    from = Math.min(from, data.firstAt);
    to = Math.max(to, data.lastAt);
  }
  if (count === 0) return null;
  return `${count} refused requests from ${new Date(from).toISOString()} to ${new Date(to).toISOString()} were counted without their ids (more waited than are kept while the journal refused writes): if it was refused then, its id was not kept`;
}

export function describeEvent(ev: JournalEvent): string {
  switch (ev.type) {
    case 'room.created': {
      const d = ev.data;
      const prefix =
        d.prefixBlocks !== undefined
          ? `, prefix ${d.prefixBlocks} blocks (${d.expectedBlocks ?? 0} expected cached)`
          : '';
      return `${d.prefillEngine} → ${d.decodeEngine}, prompt ${d.promptTokens ?? '?'} tok, max ${d.maxTokens ?? '?'}${prefix}${d.migratedFrom ? `, migrated from ${d.migratedFrom}` : ''}${d.requestId ? `, request ${d.requestId}` : ''}`;
    }
    case 'room.prefill_started':
      return ev.data.evictedBlocks ? `evicted ${ev.data.evictedBlocks.length} cached blocks` : '';
    case 'room.bootstrapped':
      return `${ev.data.pages.length} pages reserved${ev.data.epoch !== undefined ? `, epoch ${ev.data.epoch}` : ''}`;
    case 'room.transfer_posted': {
      const d = ev.data;
      const blocks = [
        d.reusedBlocks !== undefined ? `reused ${d.reusedBlocks} cached blocks` : '',
        d.storedBlocks ? `stored ${d.storedBlocks.length}` : '',
        d.evictedBlocks ? `evicted ${d.evictedBlocks.length}` : '',
      ].filter((s) => s !== '');
      const pages =
        d.pairs !== undefined
          ? [`${d.pairs} page pairs${d.bytes !== undefined ? `, ${d.bytes} B` : ''}`]
          : [];
      return [...pages, ...blocks].join(', ');
    }
    case 'room.transfer_completed': {
      const d = ev.data;
      const first =
        d.firstToken === undefined
          ? ''
          : d.firstToken === null
            ? ', the text ended at once'
            : `, first token ${JSON.stringify(d.firstToken.text)}`;
      return `${d.bytes} B in ${formatDuration(d.micros / 1000)}, checksum ${d.checksum}${first}`;
    }
    case 'room.completed':
      return `${ev.data.tokens} tokens, ${ev.data.finishReason}`;
    case 'room.aborted':
      return `${ev.data.reason} (from ${ev.data.source})`;
    case 'room.failed':
      return `${ev.data.reason} in ${ev.data.stage}, detected by ${ev.data.detectedBy}`;
    case 'room.migrated': {
      const d = ev.data;
      return `continues in ${d.toRoom}${d.detail ? ` (${d.detail})` : d.reason ? ` (${d.reason})` : ''}`;
    }
    case 'room.abort_requested':
      return ev.data.reason;
    case 'room.released':
      return `${ev.engine} freed ${ev.data.pages !== undefined ? `${ev.data.pages} pages` : 'its pages'}`;
    case 'room.event_rejected': {
      const d = ev.data;
      return `${d.eventType} rejected: ${d.reason}${d.state ? ` (room was ${d.state})` : ''}`;
    }
    case 'journal.opened': {
      const d = ev.data;
      return `schema ${d.schemaVersion}, durability ${d.durability}, pid ${d.pid}, pdctl ${d.version}`;
    }
    case 'journal.pruned': {
      const d = ev.data;
      return `${d.rooms} rooms, ${d.events} events ended before ${new Date(d.cutoffTs).toISOString()}`;
    }
    case 'recovery.action':
      return `${ev.data.action}: ${ev.data.reason} → ${ev.data.outcome}`;
    case 'request.refused': {
      const d = ev.data;
      const ids = d.requestIds;
      return `${d.count} × ${d.status} ${d.reason}${ids.length ? ` (requests ${ids.slice(0, 3).join(', ')}${d.count > 3 ? ', …' : ''})` : ''}: ${d.message}`;
    }
    case 'engine.registered':
      return `${ev.data.role}, incarnation ${ev.data.incarnation}`;
    case 'engine.stalled':
    case 'engine.lost':
    case 'engine.recovered':
    case 'engine.restarted': {
      const { reason, ...rest } = ev.data;
      const extra = Object.entries(rest).map(
        ([k, v]) => `${k} ${typeof v === 'string' ? v : JSON.stringify(v)}`,
      );
      return [String(reason), ...extra].join(', ');
    }
    default: {
      const s = JSON.stringify(ev.data);
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

/**
 * Why a room id of a time the journal covered names no room: the retention pass whose cutoff its
 * time precedes (`pruned`: every `journal.pruned`, oldest first), or that it was never created
 * here. Null when the id's time cannot be read from it.
 */
export function describeMissingRoom(
  idTime: number | null,
  pruned: readonly JournalEventOf<'journal.pruned'>[],
): string | null {
  if (idTime === null) return null;
  const pass = pruned.find((ev) => idTime < ev.data.cutoffTs);
  if (!pass) {
    const newest = pruned.at(-1);
    return newest
      ? `never created here: its id is of ${formatTs(idTime)}, after the newest retention cutoff (${formatTs(newest.data.cutoffTs)})`
      : `never created here: nothing was ever pruned from this journal (its id is of ${formatTs(idTime)})`;
  }
  const archived = pass.data.archived
    ? ' it archived them first: pdctl room ID --archive DIR reads the archive (serve --archive names DIR)'
    : ' it kept no archive';
  return `pruned, if it was ever here: its id is of ${formatTs(idTime)}, before the cutoff ${formatTs(pass.data.cutoffTs)} of the retention pass at ${formatTs(pass.ts)} (seq ${pass.seq}), which deleted the rooms that had ended by then, or a later pass;${archived}`;
}
