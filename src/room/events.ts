/**
 * Every journal event type of docs/design.md §3, its data schema, and the one validator used at the
 * boundary (appends from the API, the bus and the CLI all pass through `validateEvent`).
 */
import { type Static, type TObject, Type } from '@sinclair/typebox';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import { type Clock, systemClock } from '../ports/clock.ts';
import { type Ids, systemIds } from '../ports/ids.ts';
import { RoomError } from './errors.ts';
import { ID_PATTERN, isValidId } from './ids.ts';
import type { RoomFailureReason, RoomMigrationReason } from './reasons.ts';
import { LIVE_STATES, ROOM_STATES } from './states.ts';

const Id = Type.String({ pattern: ID_PATTERN });
const Text = Type.String({ minLength: 1, maxLength: 500 });
const Count = Type.Integer({ minimum: 0 });
const strict = { additionalProperties: false } as const;
const open = { additionalProperties: true } as const;

/** How a room's KV moves between its engines: shared memory, CUDA IPC (one host), or UCX (any two). */
export const KV_TRANSPORTS = ['shm', 'cuda', 'ucx'] as const;
export type KvTransport = (typeof KV_TRANSPORTS)[number];
const Transport = Type.Union(KV_TRANSPORTS.map((t) => Type.Literal(t)));
/** A tenant's priority band: interactive requests go before batch ones (src/tenants/). */
export const BANDS = ['interactive', 'batch'] as const;
const Band = Type.Union(BANDS.map((b) => Type.Literal(b)));
const KeyHash = Type.String({ pattern: '^[0-9a-f]{64}$' });
const KeyId = Type.String({ pattern: '^[0-9a-f]{8}$' });

/** Prefix block names (model/prefix-blocks.ts), as engines report what their caches hold. */
const BlockNames = Type.Array(Type.String({ pattern: '^[0-9a-f]{32}$' }), { maxItems: 1 << 16 });

const Deadlines = Type.Partial(
  Type.Object(
    Object.fromEntries(LIVE_STATES.map((s) => [s, Type.Integer({ minimum: 1 })])) as Record<
      (typeof LIVE_STATES)[number],
      ReturnType<typeof Type.Integer>
    >,
    strict,
  ),
);

export const EVENT_SCHEMAS = {
  'room.created': Type.Object(
    {
      prefillEngine: Id,
      decodeEngine: Id,
      promptTokens: Type.Optional(Count),
      maxTokens: Type.Optional(Count),
      model: Type.Optional(Text),
      deadlinesMs: Type.Optional(Deadlines),
      migratedFrom: Type.Optional(Id),
      /** The room of the same request that failed before its first token, tried again as this one. */
      retriedFrom: Type.Optional(Id),
      /**
       * How the pair was expected to move the room's KV when it was chosen (control/intake/pairs.ts);
       * `room.transfer_completed.transport` says what moved it. Absent: before it was recorded.
       */
      transport: Type.Optional(Transport),
      /** Full prefix blocks of the room's context (model/prefix-blocks.ts). */
      prefixBlocks: Type.Optional(Count),
      /**
       * Leading blocks of those the router expected the prefill engine to hold when it chose it
       * (routing/router.ts); `room.transfer_posted.reusedBlocks` says how many it really reused.
       */
      expectedBlocks: Type.Optional(Count),
      /** The HTTP request's `x-request-id` (given by the client, or made by the API). */
      requestId: Type.Optional(Type.String({ minLength: 1, maxLength: 128 })),
      /** The tenant whose key the request came with, and its band; absent: an open API. */
      tenant: Type.Optional(Id),
      band: Type.Optional(Band),
      /**
       * Milliseconds the request waited in flow control's queue before this, its first room
       * (control/flow/); absent: it did not wait. Its migrations and retries do not repeat it.
       */
      waitedMs: Type.Optional(Count),
      /**
       * How its tokens are drawn (the API's request, with the seed it drew when the client sent
       * none): the same sampling and seed give the same text, also in a migration's continuation.
       */
      sampling: Type.Optional(
        Type.Object(
          {
            temperature: Type.Optional(Type.Number({ minimum: 0 })),
            topP: Type.Optional(Type.Number()),
            topK: Type.Optional(Count),
            seed: Type.Optional(Count),
            frequencyPenalty: Type.Optional(Type.Number()),
            presencePenalty: Type.Optional(Type.Number()),
          },
          strict,
        ),
      ),
      /** The client's W3C `traceparent`, when it sent a valid one. */
      traceparent: Type.Optional(
        Type.String({ pattern: '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$' }),
      ),
      /**
       * The decode pages the control plane chose for the room (control/pages/page-map.ts), in the
       * pool of that incarnation of the decode engine: it claims exactly these, or fails the room
       * `kv_reservation_refused`. Absent: the decode engine chooses (protocol 5 and before, or an
       * engine whose pool the control plane does not know).
       */
      reservation: Type.Optional(
        Type.Object(
          {
            decode: Type.Object(
              {
                pages: Type.Array(Count, { minItems: 1, maxItems: 1 << 20 }),
                pool: Type.String({ minLength: 1, maxLength: 255 }),
                epoch: Count,
                incarnation: Text,
              },
              strict,
            ),
          },
          strict,
        ),
      ),
    },
    strict,
  ),
  'room.bootstrap_started': Type.Object({}, strict),
  'room.bootstrapped': Type.Object(
    {
      pages: Type.Array(Count, { maxItems: 1 << 20 }),
      /** The decode engine's pool (shared-memory name) and the epoch the pages belong to. */
      pool: Type.Optional(Type.String({ minLength: 1, maxLength: 255 })),
      epoch: Type.Optional(Count),
    },
    strict,
  ),
  'room.prefill_started': Type.Object(
    {
      /** Prefix blocks the prefill engine evicted to find the room its pages. */
      evictedBlocks: Type.Optional(BlockNames),
    },
    strict,
  ),
  'room.transfer_posted': Type.Object(
    {
      pairs: Type.Optional(Count),
      bytes: Type.Optional(Count),
      /** Microseconds the model spent computing the KV. */
      computeMicros: Type.Optional(Count),
      /** Leading blocks of the room's context whose KV came from the engine's prefix cache. */
      reusedBlocks: Type.Optional(Count),
      /** Blocks of the room's context the engine's prefix cache holds from now on. */
      storedBlocks: Type.Optional(BlockNames),
      /** Blocks its cache let go to make room for those. */
      evictedBlocks: Type.Optional(BlockNames),
    },
    strict,
  ),
  'room.transfer_completed': Type.Object(
    {
      bytes: Count,
      checksum: Type.String({ pattern: '^[0-9a-f]{1,64}$' }),
      micros: Count,
      /**
       * The answer's first token, drawn by the prefill engine from the prompt's last logits and
       * streamed to the client before the transfer (protocol 9): its id and the text it added.
       * The decode engine continues after it. Null: the model ended the text at once. Absent:
       * written before protocol 9. (Before `transport`, which a journal keeps once.)
       */
      firstToken: Type.Optional(
        Type.Union([
          Type.Object({ token: Count, text: Type.String({ maxLength: 1024 }) }, strict),
          Type.Null(),
        ]),
      ),
      /** What moved the bytes: shared memory, CUDA, or UCX (another host). Absent: before it was recorded. */
      transport: Type.Optional(Transport),
    },
    strict,
  ),
  'room.decode_started': Type.Object({}, strict),
  'room.completed': Type.Object(
    {
      tokens: Count,
      finishReason: Text,
      /** Microseconds the model spent in decode steps. */
      computeMicros: Type.Optional(Count),
    },
    strict,
  ),
  'room.aborted': Type.Object({ reason: Text, source: Text }, strict),
  'room.failed': Type.Object(
    {
      /** One of journal/reasons.ts; another is recorded as text, never refused (nothing is lost). */
      reason: Type.Unsafe<RoomFailureReason>(Text),
      stage: Type.Union(ROOM_STATES.map((s) => Type.Literal(s))),
      detectedBy: Text,
    },
    strict,
  ),
  'room.migrated': Type.Object(
    {
      toRoom: Id,
      /** Why it moved, a code of journal/reasons.ts (`engine_lost`); older journals hold free text here. */
      reason: Type.Optional(Type.Unsafe<RoomMigrationReason>(Text)),
      /** What happened, in words: `decode-0 lost: process 4242 exited (SIGKILL)`. */
      detail: Type.Optional(Text),
      /** Tokens already streamed to the client, which the new room continues after. */
      tokens: Type.Optional(Count),
    },
    strict,
  ),
  'room.abort_requested': Type.Object({ reason: Text }, strict),
  'room.released': Type.Object(
    {
      pages: Type.Optional(Count),
      /**
       * A decode engine's first tokens for the room computed on the `kv_arrived` hint and thrown
       * away: the room ended before its `room.transfer_completed` committed (protocol 7).
       */
      speculativeTokens: Type.Optional(Count),
    },
    strict,
  ),
  'room.event_rejected': Type.Object(
    {
      eventType: Text,
      reason: Text,
      state: Type.Union([Text, Type.Null()]),
      data: Type.Unknown(),
    },
    strict,
  ),
  'engine.registered': Type.Object(
    {
      role: Type.Union([Type.Literal('prefill'), Type.Literal('decode')]),
      incarnation: Text,
      pid: Type.Optional(Count),
      pool: Type.Optional(Text),
      pages: Type.Optional(Count),
    },
    open,
  ),
  'engine.lost': Type.Object({ reason: Text }, open),
  'engine.stalled': Type.Object({ reason: Text }, open),
  'engine.recovered': Type.Object(
    {
      reason: Text,
      /** The ladder rung that worked, and how long after the stall began (ms). */
      rung: Type.Optional(Text),
      recoverMs: Type.Optional(Count),
    },
    open,
  ),
  'engine.restarted': Type.Object({ reason: Text }, open),
  /**
   * The engine takes no new rooms until an operator uncordons it: the ladder's top rung for one
   * faulty engine (or an operator's). Its rooms in flight moved to healthy pairs and that
   * incarnation was fenced; later incarnations register, cordoned, for inspection.
   */
  'engine.cordoned': Type.Object(
    {
      reason: Text,
      /** `ladder` or `operator`. */
      by: Text,
      /** Why the fault is the engine's own and not what the engines share (the ladder's). */
      evidence: Type.Optional(Text),
      /** Its live rooms when it was cordoned. */
      rooms: Type.Optional(Count),
    },
    open,
  ),
  'engine.uncordoned': Type.Object({ reason: Text, by: Text }, open),
  /**
   * An engine the planner (or an operator) started or retires, step by step: `started`; or
   * `draining` (no new rooms) → `drained` (`rooms`: those still running at the drain deadline,
   * moved to other engines when it stops) → `stopped`. `role`: the engine's.
   */
  'engine.lifecycle': Type.Object(
    {
      state: Type.Union([
        Type.Literal('started'),
        Type.Literal('draining'),
        Type.Literal('drained'),
        Type.Literal('stopped'),
      ]),
      role: Type.Union([Type.Literal('prefill'), Type.Literal('decode')]),
      by: Text,
      reason: Text,
      rooms: Type.Optional(Count),
      /** `started` in a change of role: the engine of the other role it takes the place of. */
      replaces: Type.Optional(Id),
    },
    open,
  ),
  /**
   * Out of rotation as an outlier (recovery/outliers.ts): its rooms failed, by the reasons that
   * blame it, in a row or far more often than its role's peers'. No room goes to it until a
   * canary through it passes, tried from `ejectedMs` on.
   */
  'engine.ejected': Type.Object(
    {
      reason: Text,
      /** Times it was ejected since the control plane started (each lasts longer). */
      times: Count,
      ejectedMs: Count,
      consecutiveFailures: Count,
      /** Of its last rooms counted, the share that failed by its fault; and its peers'. */
      failureRate: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
      peersFailureRate: Type.Optional(Type.Number({ minimum: 0, maximum: 1 })),
    },
    open,
  ),
  /** Back in rotation: a canary through it passed. */
  'engine.returned': Type.Object({ reason: Text, canaryRoom: Type.Optional(Id) }, open),
  /** An engine process the supervisor ran has exited, however it ended. */
  'engine.exited': Type.Object(
    {
      pid: Count,
      /** Its exit code, or null when a signal ended it. */
      code: Type.Union([Count, Type.Null()]),
      signal: Type.Union([Text, Type.Null()]),
      /** Live rooms the control plane had on it when it went. */
      rooms: Count,
      /** Times this engine was started again before this exit. */
      restarts: Count,
      /** True when pdctl itself ended it (shutdown, a ladder restart); false for a crash. */
      expected: Type.Boolean(),
    },
    open,
  ),
  'recovery.action': Type.Object(
    {
      action: Text,
      reason: Text,
      outcome: Text,
      /** How long after the problem began it was detected, in ms. */
      detectMs: Type.Optional(Count),
      /** How long after the problem began service was restored (on `recovered` outcomes), in ms. */
      recoverMs: Type.Optional(Count),
      /** The room state involved, when the action is about one room. */
      stage: Type.Optional(Text),
      /** `retry_room`: the room the request was tried again as. */
      toRoom: Type.Optional(Id),
      /**
       * `retry_room`, `answer_complete`: tokens its client had been streamed (the first, from the
       * failed room's prefill engine, and any before it), which the new room continues after.
       */
      tokens: Type.Optional(Count),
      /** The ladder's top rung: why it cordoned the engine, or restarted every one. */
      evidence: Type.Optional(Text),
      /** The ladder's top rung: the engines that stalled within its window, this one included. */
      stalled: Type.Optional(Type.Array(Id, { maxItems: 1024 })),
    },
    open,
  ),
  'journal.opened': Type.Object(
    { schemaVersion: Count, durability: Text, pid: Count, version: Text },
    open,
  ),
  /**
   * A retention pass that deleted anything: rooms that ended before `cutoffTs` with their
   * `events`; with `eventsCutoffTs`, `otherEvents` of no room before it; `archived` when the
   * archive has them.
   */
  'journal.pruned': Type.Object(
    {
      cutoffTs: Count,
      rooms: Count,
      events: Count,
      eventsCutoffTs: Type.Optional(Count),
      otherEvents: Type.Optional(Count),
      /** What it deleted was written to the archive first (`--archive`). */
      archived: Type.Optional(Type.Boolean()),
    },
    open,
  ),
  /** The canary room's verdict changed (ok → failing or back); written only on change. */
  'canary.changed': Type.Object(
    {
      ok: Type.Boolean(),
      stage: Type.Union([Text, Type.Null()]),
      reason: Type.Union([Text, Type.Null()]),
      ms: Count,
    },
    open,
  ),
  /**
   * Requests refused before any room existed (no engines, every engine draining, overload, the
   * journal refusing writes, shutting down): one event per reason per second at most, counting
   * them, so that a flood of refusals cannot flood the journal.
   */
  'request.refused': Type.Object(
    {
      /** The API error code the clients got: `no_engines`, `overloaded`, … */
      reason: Type.String({ pattern: '^[a-z][a-z0-9_]{0,63}$' }),
      /** The tenant whose requests they were (refusals are gathered per reason and tenant). */
      tenant: Type.Optional(Id),
      /** The HTTP status they got (429 or 503). */
      status: Count,
      count: Type.Integer({ minimum: 1 }),
      /** Their request ids (x-request-id), at most 20 (api/refusals.ts: every one, 20 to an event). */
      requestIds: Type.Array(Type.String({ minLength: 1, maxLength: 128 }), { maxItems: 20 }),
      /** What the first of them was told. */
      message: Text,
      /** When the first and the last of them were refused (unix ms). */
      firstAt: Count,
      lastAt: Count,
    },
    open,
  ),
  /**
   * Requests that waited in flow control's queue before their rooms (control/flow/), gathered as
   * refusals are: per reason and tenant, at most 20 request ids to an event. Each of their rooms
   * records its own wait too (`room.created.waitedMs`).
   */
  'request.waited': Type.Object(
    {
      /** What held them: the code they would have been refused with (`overloaded`, …). */
      reason: Type.String({ pattern: '^[a-z][a-z0-9_]{0,63}$' }),
      tenant: Type.Optional(Id),
      count: Type.Integer({ minimum: 1 }),
      requestIds: Type.Array(Type.String({ minLength: 1, maxLength: 128 }), { maxItems: 20 }),
      /** Their waits, summed, and the longest, in ms. */
      waitedMs: Count,
      maxWaitedMs: Count,
      firstAt: Count,
      lastAt: Count,
    },
    open,
  ),
  /**
   * A tenant of the serving API (`pdctl tenants add`): its band, its limits, and the SHA-256 of
   * its key — never the key (src/tenants/). Tenant events are kept by retention.
   */
  'tenant.added': Type.Object(
    {
      tenant: Id,
      band: Band,
      maxConcurrency: Type.Optional(Type.Integer({ minimum: 1 })),
      tokensPerMinute: Type.Optional(Type.Integer({ minimum: 1 })),
      keyHash: KeyHash,
      /** The hash's first 8 hex digits: how lists and logs name the key. */
      keyId: KeyId,
    },
    strict,
  ),
  /** The tenant's key replaced: the old one is refused from this event on. */
  'tenant.key_rotated': Type.Object({ tenant: Id, keyHash: KeyHash, keyId: KeyId }, strict),
  /** The tenant ended: its key is refused from this event on; its name is not given again. */
  'tenant.revoked': Type.Object({ tenant: Id, reason: Type.Optional(Text) }, strict),
  'drill.started': Type.Object({ scenario: Text, clients: Type.Optional(Count) }, open),
  'drill.finished': Type.Object(
    {
      scenario: Text,
      passed: Type.Boolean(),
      invariants: Type.Optional(Type.Array(Type.Unknown())),
    },
    open,
  ),
  /**
   * The planner's decision for one interval (src/planner/model.ts, docs/planner.md): what it read,
   * the split it heads for, the one step it proposes, why, and whether it acted on it.
   */
  'planner.decision': Type.Object(
    {
      mode: Text,
      reason: Text,
      fleet: Type.Object({ prefill: Count, decode: Count }, open),
      target: Type.Object({ prefill: Count, decode: Count }, open),
      proposal: Type.Object({ prefill: Count, decode: Count }, open),
      acted: Type.Boolean(),
      /** The interval's record (planner/record.ts `WindowSummary`): its bounds, rates, distributions. */
      inputs: Type.Object({ from: Count, to: Count, arrivalsPerS: Type.Number() }, open),
    },
    open,
  ),
} satisfies Record<string, TObject>;

export type EventType = keyof typeof EVENT_SCHEMAS;
export type EventData<T extends EventType> = Static<(typeof EVENT_SCHEMAS)[T]>;
export const EVENT_TYPES = Object.keys(EVENT_SCHEMAS) as EventType[];

/**
 * The keys of a `room.created` that rooms repeat — its engines, model, transport and deadline
 * table — written last, in this order: a journal may store them once for many rooms and append
 * them back (sqlite/event-rows.ts), and the text it gives back is the text appended.
 */
export const CREATED_REPEATED_KEYS = [
  'prefillEngine',
  'decodeEngine',
  'model',
  'transport',
  'deadlinesMs',
] as const;

export type RoomEventType = Extract<EventType, `room.${string}`>;
/** The pages the control plane reserved for a room in its `room.created` (protocol 6). */
export type RoomReservation = NonNullable<EventData<'room.created'>['reservation']>;

/** Event types whose envelope must name a room, and which the reducer folds. */
export function isRoomEventType(type: string): type is RoomEventType {
  return type.startsWith('room.');
}

/** What a caller hands to `append`. `ts` defaults to now; `eventId` to a random UUID. */
export type EventInput = {
  [T in EventType]: {
    type: T;
    room?: string | null;
    engine?: string | null;
    source: string;
    eventId?: string;
    ts?: number;
    data: EventData<T>;
  };
}[EventType];

/** What every committed event has besides its type and data. */
interface Envelope {
  seq: number;
  ts: number;
  room: string | null;
  engine: string | null;
  source: string;
  eventId: string;
}

/**
 * An event as committed to the journal: a union over `EVENT_SCHEMAS`, so that a reader narrows
 * by `type` and gets that type's data, with no cast.
 */
export type JournalEvent = {
  [T in EventType]: Envelope & { type: T; data: EventData<T> };
}[EventType];

/** A committed event of one type. */
export type JournalEventOf<T extends EventType> = Extract<JournalEvent, { type: T }>;

/** A validated event waiting for its sequence number. */
export type PendingEvent = {
  [T in EventType]: Omit<Envelope, 'seq'> & { type: T; data: EventData<T> };
}[EventType];

type Checker = {
  Check(v: unknown): boolean;
  Errors(v: unknown): { First(): { path: string; message: string } | undefined };
};
const checkers = Object.fromEntries(
  Object.entries(EVENT_SCHEMAS).map(([type, schema]) => [
    type,
    TypeCompiler.Compile(schema as TObject),
  ]),
) as unknown as Record<EventType, Checker>;

/** Types a caller may not append: they are written by the journal itself. */
const INTERNAL_TYPES = new Set<string>(['room.event_rejected', 'journal.pruned']);

/** Event types that must name the engine that produced them. */
const NEEDS_ENGINE = new Set<string>([
  'room.released',
  'engine.registered',
  'engine.lost',
  'engine.stalled',
  'engine.recovered',
  'engine.restarted',
  'engine.exited',
  'engine.cordoned',
  'engine.uncordoned',
  'engine.lifecycle',
  'engine.ejected',
  'engine.returned',
]);

/**
 * What is wrong with `data` as the data of a `type` event, naming the field (`data.pages.0 …`);
 * null when it is that type's.
 */
export function dataError(type: EventType, data: unknown): string | null {
  const checker = checkers[type];
  if (checker.Check(data)) return null;
  const first = checker.Errors(data).First();
  const where = first?.path ? `data${first.path.replaceAll('/', '.')}` : 'data';
  return `${where} ${first?.message ?? 'is invalid'}`;
}

function invalid(message: string): RoomError {
  return new RoomError('ROOM_INVALID_EVENT', message);
}

/**
 * Validates an event at the boundary and fills `ts` and `eventId`. Throws a `RoomError` with
 * code `ROOM_INVALID_EVENT` whose message names the field that is wrong.
 */
export function validateEvent(
  input: unknown,
  options: {
    internal?: boolean;
    /** Stamps `ts` on an event without one. Default: the process's clock. */
    clock?: Clock;
    /** Names an event without an `eventId`. Default: the process's ids. */
    ids?: Ids;
  } = {},
): PendingEvent {
  if (typeof input !== 'object' || input === null) throw invalid('event must be an object');
  const ev = input as Record<string, unknown>;
  const type = ev.type;
  if (typeof type !== 'string' || !Object.hasOwn(checkers, type)) {
    throw invalid(
      `unknown event type ${JSON.stringify(type)}; known types: ${EVENT_TYPES.join(', ')}`,
    );
  }
  if (INTERNAL_TYPES.has(type) && !options.internal) {
    throw invalid(`${type} is written by the journal itself and cannot be appended`);
  }
  const room = ev.room ?? null;
  if (isRoomEventType(type)) {
    if (typeof room !== 'string' || !isValidId(room)) {
      throw invalid(
        `${type}: room must be an id matching ${ID_PATTERN}, got ${JSON.stringify(room)}`,
      );
    }
  } else if (room !== null && (typeof room !== 'string' || !isValidId(room))) {
    throw invalid(`${type}: room must be null or an id matching ${ID_PATTERN}`);
  }
  const engine = ev.engine ?? null;
  if (engine !== null && (typeof engine !== 'string' || !isValidId(engine))) {
    throw invalid(
      `${type}: engine must be an id matching ${ID_PATTERN}, got ${JSON.stringify(engine)}`,
    );
  }
  if (engine === null && NEEDS_ENGINE.has(type)) throw invalid(`${type}: engine is required`);
  const source = ev.source;
  if (typeof source !== 'string' || source.length === 0 || source.length > 200) {
    throw invalid(`${type}: source must be a non-empty string of at most 200 characters`);
  }
  let eventId = ev.eventId;
  if (eventId === undefined || eventId === null) eventId = (options.ids ?? systemIds).uuid();
  else if (typeof eventId !== 'string' || eventId.length === 0 || eventId.length > 400) {
    throw invalid(`${type}: eventId must be a non-empty string of at most 400 characters`);
  }
  let ts = ev.ts;
  if (ts === undefined || ts === null) ts = (options.clock ?? systemClock).now();
  else if (typeof ts !== 'number' || !Number.isSafeInteger(ts) || ts < 0) {
    throw invalid(`${type}: ts must be unix milliseconds (a non-negative integer)`);
  }
  const data = ev.data ?? {};
  const wrong = dataError(type as EventType, data);
  if (wrong !== null) throw invalid(`${type}: ${wrong}`);
  // The checker above is what makes the data this type's: the one place it is asserted.
  return {
    ts: ts as number,
    type,
    room: room as string | null,
    engine: engine as string | null,
    source,
    eventId: eventId as string,
    data,
  } as PendingEvent;
}
