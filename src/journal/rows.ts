/** Mapping between the `rooms` / `events` / `state_checkpoints` tables (the same columns in every backend) and their TypeScript shapes. */
import { eventIdOf } from '../room/event-keys.ts';
import type { EventType, JournalEvent } from '../room/events.ts';
import type { Room } from '../room/reducer.ts';
import { LIVE_STATES, type RoomState, type StateDeadlinesMs } from '../room/states.ts';
import { checkpointBreakingMigration, type Migration } from './migrations.ts';
import type { StoredCheckpoint } from './store.ts';

/** Column order of `rooms`, shared by the upsert and by `roomToParams`. */
export const ROOM_COLUMNS = [
  'room',
  'state',
  'prefill_engine',
  'decode_engine',
  'created_at',
  'updated_at',
  'state_since',
  'deadline_at',
  'terminal_at',
  'reason',
  'failed_stage',
  'detected_by',
  'abort_source',
  'abort_requested_at',
  'abort_reason',
  'migrated_from',
  'migrated_to',
  'prompt_tokens',
  'max_tokens',
  'kv_pages',
  'transfer_bytes',
  'transfer_micros',
  'checksum',
  'tokens',
  'finish_reason',
  'released_by',
  'deadlines_ms',
  'last_seq',
  'event_count',
  'origin',
  'request_id',
  'tenant',
] as const;

/**
 * The columns a room's update may change, with how to read each from a `Room`. Arrays and
 * objects are compared by reference (the reducer replaces them when they change) and stored as
 * JSON.
 */
export const MUTABLE_ROOM_FIELDS: ReadonlyArray<
  readonly [column: string, get: (r: Room) => unknown, json: boolean]
> = [
  ['state', (r) => r.state, false],
  ['updated_at', (r) => r.updatedAt, false],
  ['state_since', (r) => r.stateSince, false],
  ['deadline_at', (r) => r.deadlineAt, false],
  ['terminal_at', (r) => r.terminalAt, false],
  ['reason', (r) => r.reason, false],
  ['failed_stage', (r) => r.failedStage, false],
  ['detected_by', (r) => r.detectedBy, false],
  ['abort_source', (r) => r.abortSource, false],
  ['abort_requested_at', (r) => r.abortRequestedAt, false],
  ['abort_reason', (r) => r.abortReason, false],
  ['migrated_to', (r) => r.migratedTo, false],
  ['kv_pages', (r) => r.kvPages, false],
  ['transfer_bytes', (r) => r.transferBytes, false],
  ['transfer_micros', (r) => r.transferMicros, false],
  ['checksum', (r) => r.checksum, false],
  ['tokens', (r) => r.tokens, false],
  ['finish_reason', (r) => r.finishReason, false],
  ['released_by', (r) => r.releasedBy, true],
  ['last_seq', (r) => r.lastSeq, false],
  ['event_count', (r) => r.eventCount, false],
];

export type RoomRow = Record<(typeof ROOM_COLUMNS)[number], string | number | null>;

export function roomToParams(r: Room): Array<string | number | null> {
  return [
    r.room,
    r.state,
    r.prefillEngine,
    r.decodeEngine,
    r.createdAt,
    r.updatedAt,
    r.stateSince,
    r.deadlineAt,
    r.terminalAt,
    r.reason,
    r.failedStage,
    r.detectedBy,
    r.abortSource,
    r.abortRequestedAt,
    r.abortReason,
    r.migratedFrom,
    r.migratedTo,
    r.promptTokens,
    r.maxTokens,
    r.kvPages,
    r.transferBytes,
    r.transferMicros,
    r.checksum,
    r.tokens,
    r.finishReason,
    JSON.stringify(r.releasedBy),
    JSON.stringify(LIVE_STATES.map((s) => r.deadlinesMs[s])),
    r.lastSeq,
    r.eventCount,
    r.origin,
    r.requestId,
    r.tenant,
  ];
}

/** `deadlines_ms` holds one number per live state, in state order: compact, since every update rewrites the row. */
function deadlinesFromJson(json: string): StateDeadlinesMs {
  const values = JSON.parse(json) as number[];
  return Object.fromEntries(LIVE_STATES.map((s, i) => [s, values[i]])) as StateDeadlinesMs;
}

export function rowToRoom(row: RoomRow): Room {
  return {
    room: row.room as string,
    state: row.state as RoomState,
    prefillEngine: row.prefill_engine as string,
    decodeEngine: row.decode_engine as string,
    createdAt: row.created_at as number,
    updatedAt: row.updated_at as number,
    stateSince: row.state_since as number,
    deadlineAt: row.deadline_at as number | null,
    terminalAt: row.terminal_at as number | null,
    reason: row.reason as string | null,
    failedStage: row.failed_stage as string | null,
    detectedBy: row.detected_by as string | null,
    abortSource: row.abort_source as string | null,
    abortRequestedAt: row.abort_requested_at as number | null,
    abortReason: row.abort_reason as string | null,
    migratedFrom: row.migrated_from as string | null,
    migratedTo: row.migrated_to as string | null,
    promptTokens: row.prompt_tokens as number | null,
    maxTokens: row.max_tokens as number | null,
    kvPages: row.kv_pages as number | null,
    transferBytes: row.transfer_bytes as number | null,
    transferMicros: row.transfer_micros as number | null,
    checksum: row.checksum as string | null,
    tokens: row.tokens as number | null,
    finishReason: row.finish_reason as string | null,
    releasedBy: JSON.parse(row.released_by as string) as string[],
    deadlinesMs: deadlinesFromJson(row.deadlines_ms as string),
    lastSeq: row.last_seq as number,
    eventCount: row.event_count as number,
    origin: row.origin as string,
    requestId: (row.request_id as string | null) ?? null,
    tenant: (row.tenant as string | null) ?? null,
  };
}

export interface EventRow {
  seq: number;
  ts: number;
  type: string;
  room: string | null;
  engine: string | null;
  source: string;
  /** The stored key (journal/event-keys.ts). */
  event_id: Buffer;
  data: string;
}

/**
 * A stored row as the event it is: the read boundary, where a row's type and data are taken as
 * the schema's (every event was validated against it when appended).
 */
export function rowToEvent(row: EventRow): JournalEvent {
  return {
    seq: row.seq,
    ts: row.ts,
    type: row.type as EventType,
    room: row.room,
    engine: row.engine,
    source: row.source,
    eventId: eventIdOf(row.event_id, row.source),
    data: JSON.parse(row.data),
  } as JournalEvent;
}

/** A `state_checkpoints` row, with the journal's schema version now (`current_schema`). */
export interface CheckpointRow {
  name: string;
  seq: number | string;
  format: number;
  schema_version: number;
  written_at: number | string;
  digest: string;
  data: string;
  current_schema: number | null;
}

export function checkpointFromRow(
  row: CheckpointRow,
  migrations: readonly Migration[],
): StoredCheckpoint {
  const current = row.current_schema ?? 0;
  return {
    name: row.name,
    seq: Number(row.seq),
    format: row.format,
    schemaVersion: row.schema_version,
    currentSchemaVersion: current,
    brokenBy: checkpointBreakingMigration(migrations, row.schema_version, current),
    writtenAt: Number(row.written_at),
    digest: row.digest,
    data: row.data,
  };
}
