/**
 * The simulator's invariants over a journal (issue 41, item 4), checked from its committed events
 * alone, so they hold whichever backend wrote them. Safety — true after every step — and liveness
 * — true once every fault is healed and the run has settled — are kept apart, as TigerBeetle's
 * VOPR keeps them. Each broken invariant is named, with the seq and room that break it.
 */
import type { JournalEvent } from '../room/events.ts';
import { isTerminal, TERMINAL_STATES } from '../room/states.ts';

export interface Violation {
  invariant: string;
  room: string | null;
  seq: number;
  detail: string;
}

const TERMINAL_EVENTS = new Set(TERMINAL_STATES.map((s) => `room.${s}`));

interface Seen {
  prefill: string;
  decode: string;
  terminalSeq: number | null;
  released: Set<string>;
  /** The decode pages reserved in its `room.created`, as `pool/epoch/page` keys. */
  pages: string[];
}

/**
 * Safety, over committed events in seq order: seqs only grow; a room is created once and ends at
 * most once; after its end only releases follow; each engine of its pair releases it at most once,
 * and no other engine does; no decode page is reserved for a room while another room holds it
 * (from its `room.created` until its decode engine's release).
 */
export function safety(events: readonly JournalEvent[]): Violation[] {
  const out: Violation[] = [];
  const rooms = new Map<string, Seen>();
  /** Decode pages held now (`pool/epoch/page`), and by which room. */
  const held = new Map<string, string>();
  let last = 0;
  for (const ev of events) {
    const broke = (invariant: string, detail: string) =>
      out.push({ invariant, room: ev.room, seq: ev.seq, detail });
    if (ev.seq <= last) broke('seq_order', `seq ${ev.seq} follows ${last}`);
    last = Math.max(last, ev.seq);
    if (ev.room === null || !ev.type.startsWith('room.') || ev.type === 'room.event_rejected')
      continue;
    const r = rooms.get(ev.room);
    if (ev.type === 'room.created') {
      if (r) {
        broke('created_once', `room ${ev.room} created again`);
        continue;
      }
      const d = ev.data.reservation?.decode;
      const pages = d ? d.pages.map((p) => `${d.pool}/${d.epoch}/${p}`) : [];
      for (const page of pages) {
        const other = held.get(page);
        if (other !== undefined)
          broke('decode_page_reserved_once', `page ${page} reserved while ${other} holds it`);
        else held.set(page, ev.room);
      }
      rooms.set(ev.room, {
        prefill: ev.data.prefillEngine,
        decode: ev.data.decodeEngine,
        terminalSeq: null,
        released: new Set(),
        pages,
      });
      continue;
    }
    if (!r) {
      broke('created_first', `${ev.type} for a room never created`);
      continue;
    }
    if (ev.type === 'room.released') {
      const engine = ev.engine ?? '';
      if (engine !== r.prefill && engine !== r.decode)
        broke('release_by_pair', `${engine} released a room of ${r.prefill} and ${r.decode}`);
      else if (r.released.has(engine)) broke('release_once', `${engine} released it twice`);
      r.released.add(engine);
      if (engine === r.decode)
        for (const page of r.pages) if (held.get(page) === ev.room) held.delete(page);
      continue;
    }
    if (r.terminalSeq !== null) {
      broke('nothing_after_end', `${ev.type} after the room ended at seq ${r.terminalSeq}`);
      continue;
    }
    if (TERMINAL_EVENTS.has(ev.type)) r.terminalSeq = ev.seq;
  }
  return out;
}

/**
 * Liveness, once the run has settled: every room ended, and both engines of its pair released it
 * (an engine that died is released for by the control plane, under its name).
 */
export function liveness(
  events: readonly JournalEvent[],
  stateOf: (room: string) => string | undefined,
): Violation[] {
  const out: Violation[] = [];
  const rooms = new Map<string, { seq: number; pair: string[]; released: Set<string> }>();
  for (const ev of events) {
    if (ev.room === null) continue;
    if (ev.type === 'room.created')
      rooms.set(ev.room, {
        seq: ev.seq,
        pair: [ev.data.prefillEngine, ev.data.decodeEngine],
        released: new Set(),
      });
    else if (ev.type === 'room.released') rooms.get(ev.room)?.released.add(ev.engine ?? '');
  }
  for (const [room, r] of rooms) {
    const state = stateOf(room);
    if (state === undefined || !isTerminal(state as never)) {
      out.push({ invariant: 'every_room_ends', room, seq: r.seq, detail: `still ${state}` });
      continue;
    }
    const missing = r.pair.filter((e) => !r.released.has(e));
    if (missing.length > 0)
      out.push({
        invariant: 'every_room_released',
        room,
        seq: r.seq,
        detail: `${state}, never released by ${missing.join(' and ')}`,
      });
  }
  return out;
}
