/**
 * The pure room reducer: `(room, event) → room | rejection`. Shared by the journal writer, the
 * verifier, the engines and the tests. It imports nothing but the state table and event types.
 */
import type { JournalEvent, RoomEventType } from './events.ts';
import {
  isTerminal,
  type LiveState,
  type RoomState,
  resolveDeadlines,
  type StateDeadlinesMs,
} from './states.ts';

/** The projection of one room; equals the fold of its events (`rooms` table, docs/design.md §4). */
export interface Room {
  room: string;
  state: RoomState;
  prefillEngine: string;
  decodeEngine: string;
  createdAt: number;
  updatedAt: number;
  /** When the current state was entered (unix ms). */
  stateSince: number;
  /** When the current state's deadline passes (unix ms); null once terminal. */
  deadlineAt: number | null;
  terminalAt: number | null;
  deadlinesMs: StateDeadlinesMs;
  promptTokens: number | null;
  maxTokens: number | null;
  migratedFrom: string | null;
  migratedTo: string | null;
  kvPages: number | null;
  transferBytes: number | null;
  transferMicros: number | null;
  checksum: string | null;
  tokens: number | null;
  finishReason: string | null;
  /** Why the room was aborted or failed. */
  reason: string | null;
  abortSource: string | null;
  failedStage: string | null;
  detectedBy: string | null;
  abortRequestedAt: number | null;
  abortReason: string | null;
  /** Engines that have appended `room.released`, in order. */
  releasedBy: string[];
  lastSeq: number;
  eventCount: number;
  /** Who created it: the `source` of its `room.created` (`api`, `canary`, `migration`, …). */
  origin: string;
  /** The HTTP request it serves (`room.created.requestId`); null when no request made it. */
  requestId: string | null;
  /** The tenant whose key its request came with (`room.created.tenant`); null on an open API. */
  tenant: string | null;
}

export type RejectReason =
  | 'unknown_room'
  | 'room_exists'
  | 'room_terminal'
  | 'illegal_transition'
  | 'wrong_engine'
  | 'duplicate_release'
  | 'not_room_engine'
  | 'invalid_migration'
  | 'not_foldable'
  /** Not the reducer's: the event id is already taken by a different event (journal dedupe). */
  | 'event_id_conflict';

export type ReduceResult =
  | { ok: true; room: Room }
  | { ok: false; reason: RejectReason; state: RoomState | null; detail: string };

/** The event the reducer needs: a committed event, or one about to be (seq may be provisional). */
/** What the reducer reads of an event; `source` only of `room.created` (the room's origin). */
export type ReducibleEvent = JournalEvent extends infer E
  ? E extends JournalEvent
    ? Pick<E, 'seq' | 'ts' | 'type' | 'room' | 'engine' | 'data'> & Partial<Pick<E, 'source'>>
    : never
  : never;

/** One forward step of docs/design.md §3. */
interface Step {
  /** The states the room must be in. */
  from: readonly RoomState[];
  /** The state it leads to. */
  to: RoomState;
  role: 'prefill' | 'decode';
  /**
   * States past `to` in which the event is taken without moving the room: the decode engine's
   * acknowledgement of its reserved pages, when the prefill engine started on `room.created`
   * (protocol 7) and the room moved on before the acknowledgement committed.
   */
  after?: readonly RoomState[];
}

/** Past `waiting_for_input`, before the decode engine's own `room.decode_started`. */
const BEFORE_DECODE: readonly RoomState[] = ['prefilling', 'transferring', 'transferred'];

const FORWARD: Partial<Record<RoomEventType, Step>> = {
  'room.bootstrap_started': {
    from: ['created'],
    to: 'bootstrapping',
    role: 'decode',
    after: BEFORE_DECODE,
  },
  'room.bootstrapped': {
    from: ['bootstrapping'],
    to: 'waiting_for_input',
    role: 'decode',
    after: BEFORE_DECODE,
  },
  // On `room.created` when the control plane reserved the decode pages (protocol 7); else once
  // they are bootstrapped.
  'room.prefill_started': {
    from: ['created', 'bootstrapping', 'waiting_for_input'],
    to: 'prefilling',
    role: 'prefill',
  },
  'room.transfer_posted': { from: ['prefilling'], to: 'transferring', role: 'prefill' },
  'room.transfer_completed': { from: ['transferring'], to: 'transferred', role: 'prefill' },
  'room.decode_started': { from: ['transferred'], to: 'decoding', role: 'decode' },
  'room.completed': { from: ['decoding'], to: 'completed', role: 'decode' },
};

function reject(
  reason: RejectReason,
  state: RoomState | null,
  detail: string,
): Extract<ReduceResult, { ok: false }> {
  return { ok: false, reason, state, detail };
}

/**
 * A fresh copy with every field in one fixed order: the reducer never mutates its input, and one
 * object shape keeps folding a million events fast (spreads of this object are several times slower).
 */
function copy(r: Room): Room {
  return {
    room: r.room,
    state: r.state,
    prefillEngine: r.prefillEngine,
    decodeEngine: r.decodeEngine,
    createdAt: r.createdAt,
    updatedAt: r.updatedAt,
    stateSince: r.stateSince,
    deadlineAt: r.deadlineAt,
    terminalAt: r.terminalAt,
    deadlinesMs: r.deadlinesMs,
    promptTokens: r.promptTokens,
    maxTokens: r.maxTokens,
    migratedFrom: r.migratedFrom,
    migratedTo: r.migratedTo,
    kvPages: r.kvPages,
    transferBytes: r.transferBytes,
    transferMicros: r.transferMicros,
    checksum: r.checksum,
    tokens: r.tokens,
    finishReason: r.finishReason,
    reason: r.reason,
    abortSource: r.abortSource,
    failedStage: r.failedStage,
    detectedBy: r.detectedBy,
    abortRequestedAt: r.abortRequestedAt,
    abortReason: r.abortReason,
    releasedBy: r.releasedBy,
    lastSeq: r.lastSeq,
    eventCount: r.eventCount,
    origin: r.origin,
    requestId: r.requestId,
    tenant: r.tenant,
  };
}

/** The copy every applied event starts from: bookkeeping fields advanced. */
function touched(room: Room, ev: ReducibleEvent): Room {
  const next = copy(room);
  next.updatedAt = ev.ts;
  next.lastSeq = ev.seq;
  next.eventCount = room.eventCount + 1;
  return next;
}

/** Moves a fresh copy (never the caller's room) into `state`. */
function enter(next: Room, state: RoomState, ts: number): Room {
  const terminal = isTerminal(state);
  next.state = state;
  next.stateSince = ts;
  next.deadlineAt = terminal ? null : ts + next.deadlinesMs[state as LiveState];
  next.terminalAt = terminal ? ts : null;
  return next;
}

function created(ev: Extract<ReducibleEvent, { type: 'room.created' }>): Room {
  const d = ev.data;
  const deadlinesMs = resolveDeadlines(d.deadlinesMs);
  return {
    room: ev.room as string,
    state: 'created',
    prefillEngine: d.prefillEngine,
    decodeEngine: d.decodeEngine,
    createdAt: ev.ts,
    updatedAt: ev.ts,
    stateSince: ev.ts,
    deadlineAt: ev.ts + deadlinesMs.created,
    terminalAt: null,
    deadlinesMs,
    promptTokens: d.promptTokens ?? null,
    maxTokens: d.maxTokens ?? null,
    migratedFrom: d.migratedFrom ?? null,
    migratedTo: null,
    kvPages: null,
    transferBytes: null,
    transferMicros: null,
    checksum: null,
    tokens: null,
    finishReason: null,
    reason: null,
    abortSource: null,
    failedStage: null,
    detectedBy: null,
    abortRequestedAt: null,
    abortReason: null,
    releasedBy: [],
    lastSeq: ev.seq,
    eventCount: 1,
    origin: ev.source ?? 'unknown',
    requestId: d.requestId ?? null,
    tenant: d.tenant ?? null,
  };
}

/**
 * Applies one event to a room (null when the journal has never seen the room). Never throws for
 * a well-formed event: an event that does not fit is returned as a rejection with a reason.
 * Event data is assumed valid (see `validateEvent`).
 */
export function reduce(room: Room | null, ev: ReducibleEvent): ReduceResult {
  const type = ev.type;
  if (ev.type === 'room.created') {
    if (room) return reject('room_exists', room.state, `room ${room.room} already exists`);
    return { ok: true, room: created(ev) };
  }
  if (!room) return reject('unknown_room', null, `no room ${ev.room} in the journal`);
  const state = room.state;

  if (type === 'room.released') {
    const engine = ev.engine as string;
    if (engine !== room.prefillEngine && engine !== room.decodeEngine) {
      return reject('not_room_engine', state, `${engine} holds no pages of room ${room.room}`);
    }
    if (room.releasedBy.includes(engine)) {
      return reject('duplicate_release', state, `${engine} already released room ${room.room}`);
    }
    const next = touched(room, ev);
    next.releasedBy = [...room.releasedBy, engine];
    return { ok: true, room: next };
  }
  if (isTerminal(state)) {
    return reject('room_terminal', state, `room ${room.room} is already ${state}`);
  }

  switch (ev.type) {
    case 'room.abort_requested': {
      const next = touched(room, ev);
      if (room.abortRequestedAt === null) {
        next.abortRequestedAt = ev.ts;
        next.abortReason = ev.data.reason;
      }
      return { ok: true, room: next };
    }
    case 'room.aborted': {
      const d = ev.data;
      const next = enter(touched(room, ev), 'aborted', ev.ts);
      next.reason = d.reason;
      next.abortSource = d.source;
      return { ok: true, room: next };
    }
    case 'room.failed': {
      const d = ev.data;
      const next = enter(touched(room, ev), 'failed', ev.ts);
      next.reason = d.reason;
      next.failedStage = d.stage;
      next.detectedBy = d.detectedBy;
      return { ok: true, room: next };
    }
    case 'room.migrated': {
      const d = ev.data;
      if (d.toRoom === room.room) {
        return reject('invalid_migration', state, 'a room cannot migrate to itself');
      }
      const next = enter(touched(room, ev), 'migrated', ev.ts);
      next.migratedTo = d.toRoom;
      if (d.reason !== undefined) next.reason = d.reason;
      return { ok: true, room: next };
    }
    case 'room.event_rejected':
      return reject('not_foldable', state, 'room.event_rejected is a record, never applied');
    default:
      break;
  }

  const step = FORWARD[type as RoomEventType];
  if (!step) return reject('illegal_transition', state, `${type} does not apply to rooms`);
  const { from, to, role } = step;
  const moves = from.includes(state);
  if (!moves && !step.after?.includes(state)) {
    return reject(
      'illegal_transition',
      state,
      `${type} needs state ${from.join(' or ')}, room is ${state}`,
    );
  }
  const owner = role === 'prefill' ? room.prefillEngine : room.decodeEngine;
  if (ev.engine !== null && ev.engine !== owner) {
    return reject(
      'wrong_engine',
      state,
      `${type} must come from ${role} engine ${owner}, not ${ev.engine}`,
    );
  }
  const next = moves ? enter(touched(room, ev), to, ev.ts) : touched(room, ev);
  if (ev.type === 'room.bootstrapped') {
    next.kvPages = ev.data.pages.length;
  } else if (ev.type === 'room.transfer_completed') {
    const d = ev.data;
    next.transferBytes = d.bytes;
    next.transferMicros = d.micros;
    next.checksum = d.checksum;
  } else if (ev.type === 'room.completed') {
    const d = ev.data;
    next.tokens = d.tokens;
    next.finishReason = d.finishReason;
  }
  return { ok: true, room: next };
}

/**
 * Folds committed events (in seq order) into the projection of every room. Rejection records and
 * events without a room are skipped, exactly as the writer skipped them. Returns the rooms and
 * the events that failed to apply (a consistent journal has none).
 */
export function fold(
  events: Iterable<ReducibleEvent>,
  rooms: Map<string, Room> = new Map(),
): { rooms: Map<string, Room>; inconsistent: Array<{ seq: number; reason: string }> } {
  const inconsistent: Array<{ seq: number; reason: string }> = [];
  for (const ev of events) {
    if (ev.room === null || ev.type === 'room.event_rejected' || !ev.type.startsWith('room.')) {
      continue;
    }
    const r = reduce(rooms.get(ev.room) ?? null, ev);
    if (r.ok) rooms.set(ev.room, r.room);
    else inconsistent.push({ seq: ev.seq, reason: `${r.reason}: ${r.detail}` });
  }
  return { rooms, inconsistent };
}
