/**
 * Why a room failed or moved: one list, part of the interface (docs/design.md §3). Engines, the
 * control plane, the watchdog, the canary and the metrics' labels all take their reasons from here,
 * so a reason outside the list is a type error where it is written. The journal still records a
 * reason it does not know (one from a newer engine, or an older journal's): refusing it would lose
 * the failure, so readers treat an unknown one as text.
 */

/** `room.failed.reason`: each one, and what it means to an operator. */
export const ROOM_FAILURE_REASONS = {
  // ── found by the control plane and the watchdog ──
  deadline_exceeded: 'the room stayed in one state past its deadline (the watchdog failed it)',
  journal_unavailable: 'the journal refused writes past the grace; the client was answered 503',
  orphaned_by_restart: 'the control plane that held its client restarted',
  migration_limit_reached: 'its engines were lost more often than --migration-limit allows',
  too_large_to_migrate: 'prompt plus streamed text no longer fits one room.created on the bus',
  generated_tokens_unknown: 'its engine lost, the token ids streamed so far were not all known',
  // ── found by an engine: its own work ──
  engine_restarted: 'its engine restarted with the room in a stage it cannot resume',
  engine_draining: 'its engine was draining and takes no new rooms',
  request_unavailable: 'the request (prompt) did not reach the engine',
  request_unusable: 'the engine could not use the request (a malformed prompt or tokens)',
  prefill_queue_full: "the prefill engine's queue was full",
  prefill_error: 'the model failed while computing the prompt',
  decode_error: 'the model failed while generating',
  kv_pool_full: "no free KV pages in the engine's pool (load, not a fault)",
  kv_reservation_refused: 'the decode pool disagreed with the pages reserved in `room.created`',
  kv_exceeds_reservation: 'the prompt took more KV pages than were reserved for it',
  kv_checksum_mismatch: "the KV that arrived does not match the prefill engine's checksum",
  kv_image_invalid: 'the KV image that arrived cannot be loaded by the model',
  bootstrap_unknown: 'the prefill engine never saw the decode side bootstrap',
  // ── found by an engine: moving the KV between the pair ──
  transfer_stalled: 'the KV transfer made no progress within its deadline',
  transfer_failed: 'the KV transfer failed (the transport reported an error)',
  transfer_cancelled: 'the KV transfer was cancelled (a reset, or the room stopped)',
  transfer_epoch_mismatch: "the decode engine's pool was replaced under the transfer",
  kv_transport_unavailable: 'no transport joins the pair (different hosts, no UCX on one end)',
  decode_pool_stale: "the decode engine's pool descriptor is from an older incarnation",
  decode_pool_invalid: "the decode engine's UCX pool descriptor could not be used",
  decode_pool_unavailable: "the decode engine's pool could not be opened",
} as const;

export type RoomFailureReason = keyof typeof ROOM_FAILURE_REASONS;
export const FAILURE_REASONS = Object.keys(ROOM_FAILURE_REASONS) as RoomFailureReason[];

/**
 * Who can see each failure happen, and so may report it: an engine of that role (the control
 * plane refuses a `room.failed` whose reason its sender's role cannot have detected:
 * control/engines/engine-appends.ts), or the control plane itself (`control`: no engine may append it).
 * A decode engine cannot see a prefill fail; what it says of one is no evidence.
 */
export type FailureReporter = 'prefill' | 'decode' | 'control';
export const FAILURE_REPORTERS: Readonly<Record<RoomFailureReason, readonly FailureReporter[]>> =
  Object.freeze({
    deadline_exceeded: ['control'],
    journal_unavailable: ['control'],
    orphaned_by_restart: ['control'],
    migration_limit_reached: ['control'],
    too_large_to_migrate: ['control'],
    generated_tokens_unknown: ['control'],
    engine_restarted: ['prefill', 'decode'],
    engine_draining: ['prefill', 'decode'],
    request_unavailable: ['prefill', 'decode'],
    request_unusable: ['prefill', 'decode'],
    prefill_queue_full: ['prefill'],
    prefill_error: ['prefill'],
    decode_error: ['decode'],
    kv_pool_full: ['prefill', 'decode'],
    kv_reservation_refused: ['decode'],
    kv_exceeds_reservation: ['prefill'],
    kv_checksum_mismatch: ['decode'],
    kv_image_invalid: ['decode'],
    bootstrap_unknown: ['prefill'],
    transfer_stalled: ['prefill'],
    transfer_failed: ['prefill'],
    transfer_cancelled: ['prefill'],
    transfer_epoch_mismatch: ['prefill'],
    kv_transport_unavailable: ['prefill'],
    decode_pool_stale: ['prefill'],
    decode_pool_invalid: ['prefill'],
    decode_pool_unavailable: ['prefill'],
  });

/**
 * Whose fault each failure is — what outlier detection counts against an engine — and whether a
 * request that failed so before any token reached its client is tried again on another pair.
 * `prefill`/`decode`: that engine of the room; `pair`: either, or the link between them (counted
 * against both, and each engine measured against its role's peers); `reporter`: the engine that
 * appended it; `none`: no engine (load, the control plane, the client, the journal).
 *
 * An engine's word is a claim: a failure is blamed on one engine alone only where that engine
 * reports it of itself. What one engine reports of the other (the prefill engine that could not
 * open the decode engine's pool) is a fault of the pair, which counts against the other engine
 * only where the reporter was seen serving its other rooms well (recovery/outliers.ts).
 */
export type FailureBlame = 'prefill' | 'decode' | 'pair' | 'reporter' | 'none';
export const FAILURE_BLAME: Readonly<
  Record<RoomFailureReason, { blame: FailureBlame; retry: boolean }>
> = Object.freeze({
  deadline_exceeded: { blame: 'none', retry: true },
  journal_unavailable: { blame: 'none', retry: false },
  orphaned_by_restart: { blame: 'none', retry: false },
  migration_limit_reached: { blame: 'none', retry: false },
  too_large_to_migrate: { blame: 'none', retry: false },
  generated_tokens_unknown: { blame: 'none', retry: false },
  engine_restarted: { blame: 'reporter', retry: true },
  engine_draining: { blame: 'none', retry: true },
  request_unavailable: { blame: 'reporter', retry: true },
  request_unusable: { blame: 'none', retry: false },
  prefill_queue_full: { blame: 'none', retry: true },
  prefill_error: { blame: 'prefill', retry: true },
  decode_error: { blame: 'decode', retry: true },
  kv_pool_full: { blame: 'none', retry: true },
  kv_reservation_refused: { blame: 'decode', retry: true },
  kv_exceeds_reservation: { blame: 'prefill', retry: true },
  kv_checksum_mismatch: { blame: 'pair', retry: true },
  kv_image_invalid: { blame: 'pair', retry: true },
  bootstrap_unknown: { blame: 'pair', retry: true },
  transfer_stalled: { blame: 'pair', retry: true },
  transfer_failed: { blame: 'pair', retry: true },
  transfer_cancelled: { blame: 'pair', retry: true },
  transfer_epoch_mismatch: { blame: 'pair', retry: true },
  kv_transport_unavailable: { blame: 'pair', retry: true },
  decode_pool_stale: { blame: 'pair', retry: true },
  decode_pool_invalid: { blame: 'pair', retry: true },
  decode_pool_unavailable: { blame: 'pair', retry: true },
});

/**
 * The failures of moving a room's KV between its pair, each counted by `pdctl_transfers_total`
 * (its `status` label: the reason without `transfer_`). `link`: the pair's link is to blame, not
 * either engine — control/intake/pairs.ts passes over that pair for a while. A stale pool descriptor is
 * not the link's fault: the decode engine restarted, and its next hello brings a fresh one.
 */
export const TRANSFER_FAILURES: Readonly<Partial<Record<RoomFailureReason, { link: boolean }>>> =
  Object.freeze({
    transfer_stalled: { link: true },
    transfer_failed: { link: true },
    transfer_cancelled: { link: true },
    transfer_epoch_mismatch: { link: true },
    kv_transport_unavailable: { link: true },
    decode_pool_invalid: { link: true },
    decode_pool_stale: { link: false },
  });

/** `room.migrated.reason`. */
export const ROOM_MIGRATION_REASONS = {
  engine_lost: 'an engine of its pair exited, came back as a new process, or was fenced',
  engine_retiring:
    'an engine of its pair is being retired (a change of role or a scale-down) and its prefill had not begun',
} as const;
export type RoomMigrationReason = keyof typeof ROOM_MIGRATION_REASONS;
export const MIGRATION_REASONS = Object.keys(ROOM_MIGRATION_REASONS) as RoomMigrationReason[];

/**
 * `room.abort_requested.reason` (and so `room.aborted.reason`) as pdctl itself gives it. An
 * operator's abort carries the text the operator gave instead, `operator` when none.
 */
export const ROOM_ABORT_REASONS = {
  client_disconnect: 'the client went away before its answer was complete',
  shutdown: 'the control plane stopped, and the room outlived its drain deadline',
  operator: 'an operator aborted it (pdctl abort, POST /v1/rooms/:id/abort) and gave no reason',
} as const;
export type RoomAbortReason = keyof typeof ROOM_ABORT_REASONS;
export const ABORT_REASONS = Object.keys(ROOM_ABORT_REASONS) as RoomAbortReason[];

/** Whether a failure reason is one of the list (a reader's check on what the journal holds). */
export function isFailureReason(reason: string | null): reason is RoomFailureReason {
  return reason !== null && Object.hasOwn(ROOM_FAILURE_REASONS, reason);
}
