/**
 * The room state machine of docs/design.md §3: states, the order in which they are entered, and the
 * default deadline of every non-terminal state. Pure data; imported by everything, imports nothing.
 */

export const ROOM_STATES = [
  'created',
  'bootstrapping',
  'waiting_for_input',
  'prefilling',
  'transferring',
  'transferred',
  'decoding',
  'completed',
  'aborted',
  'failed',
  'migrated',
] as const;

export type RoomState = (typeof ROOM_STATES)[number];

export const TERMINAL_STATES = ['completed', 'aborted', 'failed', 'migrated'] as const;
export type TerminalState = (typeof TERMINAL_STATES)[number];
export type LiveState = Exclude<RoomState, TerminalState>;

const terminal = new Set<string>(TERMINAL_STATES);

/** The non-terminal states, in the order a room passes through them. */
export const LIVE_STATES: readonly LiveState[] = ROOM_STATES.filter(
  (s): s is LiveState => !terminal.has(s),
);

export function isTerminal(state: RoomState): state is TerminalState {
  return terminal.has(state);
}

export function isRoomState(value: string): value is RoomState {
  return (ROOM_STATES as readonly string[]).includes(value);
}

/** Deadline per non-terminal state, in milliseconds from entering it. */
export type StateDeadlinesMs = Record<LiveState, number>;

/**
 * Defaults, chosen for a small-to-mid model on one node. A room that stays longer in a state is
 * failed by the watchdog with `reason: 'deadline_exceeded'` and `stage` = that state.
 * `waiting_for_input` covers the prefill queue, so it is the longest before decoding.
 */
export const DEFAULT_STATE_DEADLINES_MS: Readonly<StateDeadlinesMs> = Object.freeze({
  created: 2_000,
  bootstrapping: 5_000,
  waiting_for_input: 30_000,
  prefilling: 60_000,
  transferring: 10_000,
  transferred: 5_000,
  decoding: 600_000,
});

export function resolveDeadlines(partial: Partial<StateDeadlinesMs> | undefined): StateDeadlinesMs {
  return { ...DEFAULT_STATE_DEADLINES_MS, ...(partial ?? {}) };
}

/**
 * The events of a room that completes undisturbed, in the order of the state table — each
 * engine's `room.released` aside. With the decode pages reserved in `room.created` (protocol 7)
 * the prefill engine starts on that commit, and the decode engine's `room.bootstrap_started` and
 * `room.bootstrapped` may commit anywhere before its `room.decode_started`: the room's critical
 * path is `room.created` → prefill → `room.transfer_completed` → decode.
 */
export const ROOM_PATH = [
  'room.created',
  'room.bootstrap_started',
  'room.bootstrapped',
  'room.prefill_started',
  'room.transfer_posted',
  'room.transfer_completed',
  'room.decode_started',
  'room.completed',
] as const;
