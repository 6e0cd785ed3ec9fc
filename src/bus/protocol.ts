/**
 * The wire protocol between the control plane and the engines (docs/design.md §5, docs/protocol.md):
 * every message kind, its payload schema, and the one decoder every receive loop uses. A frame
 * is `[kind, payload]` (the ROUTER adds the peer's routing id in front); the kind is ASCII, the
 * payload a msgpack map. Decoding never throws: a bad frame comes back as a reason to count.
 */
import { type Static, type TSchema, Type } from '@sinclair/typebox';
import { TypeCompiler } from '@sinclair/typebox/compiler';
import { Packr } from 'msgpackr';
import { BUS_ERROR_CODES } from './errors.ts';

/** Bumped on any change an engine of the previous version could not follow. */
export const PROTOCOL_VERSION = 9;

/**
 * How often an engine heartbeats (its default, and what a welcome suggests): a wedged bus loop is
 * seen two heartbeats and half a second after it stops (docs/design.md, §9).
 */
export const HEARTBEAT_MS = 250;
/** Default largest payload accepted, in bytes. */
export const DEFAULT_MAX_FRAME_BYTES = 1 << 20;

/**
 * Room headroom in an `event` payload besides the request's text: the event (ids of at most 128
 * characters, data with deadlines) and the envelope. Measured under 1 KiB; 8 KiB to spare.
 */
const EVENT_OVERHEAD_BYTES = 8 << 10;

/**
 * The most request text (prompt plus text generated before a migration, UTF-8) a `room.created`
 * event can carry to an engine that accepts frames of `maxFrameBytes`.
 */
export function maxRequestTextBytes(maxFrameBytes = DEFAULT_MAX_FRAME_BYTES): number {
  return maxFrameBytes - EVENT_OVERHEAD_BYTES;
}

/**
 * Bytes of a request's text (UTF-8) and token ids (at most 5 bytes each in msgpack), as they go
 * out in its `room.created` event.
 */
export function requestTextBytes(request: {
  prompt: string;
  generated?: string;
  tokens?: readonly number[];
}): number {
  return (
    Buffer.byteLength(request.prompt) +
    Buffer.byteLength(request.generated ?? '') +
    5 * (request.tokens?.length ?? 0)
  );
}

const Id = Type.String({ pattern: '^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,127}$' });
const Seq = Type.Integer({ minimum: 0 });
const Count = Type.Integer({ minimum: 0 });
const Short = Type.String({ minLength: 1, maxLength: 200 });
const Role = Type.Union([Type.Literal('prefill'), Type.Literal('decode')]);

/**
 * How a prefill engine may send KV (hello `kvSend`): `shm` only to engines on its host, `ucx`
 * always over UCX, `auto` shared memory on its host and UCX to others.
 */
export const KV_SEND_CHOICES = ['shm', 'ucx', 'auto'] as const;
export type KvSend = (typeof KV_SEND_CHOICES)[number];

/** Stop sequences a request may give, as OpenAI takes them: up to 4, each up to 200 characters. */
export const STOP_SEQUENCES = { max: 4, maxLength: 200 } as const;
export const StopSequences = Type.Array(
  Type.String({ minLength: 1, maxLength: STOP_SEQUENCES.maxLength }),
  { maxItems: STOP_SEQUENCES.max },
);
const strict = { additionalProperties: false } as const;

/** What a peer needs to send a room's KV to a pool over UCX (src/transfer/ucx.ts, `UcxPoolDescriptor`). */
const KvRemoteWire = Type.Object(
  {
    transport: Type.Literal('ucx'),
    /** The engine's UCX worker address: where a room's KV message is sent (protocol 8). */
    address: Type.Uint8Array({ minByteLength: 1, maxByteLength: 65536 }),
    pages: Count,
    pageBytes: Count,
    /** The epoch of the pool that receives: part of each room's message tag. */
    epoch: Count,
  },
  strict,
);

export type KvRemote = Static<typeof KvRemoteWire>;

/** What a llama.cpp runtime reports of itself once its model is loaded (model/executor.ts). */
export const ModelRuntimeWire = Type.Object(
  {
    contextSize: Type.Integer({ minimum: 1, maximum: 16_777_216 }),
    threads: Type.Integer({ minimum: 0, maximum: 4096 }),
    gpu: Type.String({ minLength: 1, maxLength: 40 }),
  },
  { additionalProperties: false },
);

/** Engine → control plane. */
export const ENGINE_MESSAGES = {
  hello: Type.Object(
    {
      protocol: Type.Integer({ minimum: 1 }),
      engine: Id,
      role: Role,
      /** Unique per process start: a new one means the engine restarted and holds nothing. */
      incarnation: Short,
      pid: Count,
      pages: Count,
      pageBytes: Count,
      /**
       * Pool bytes a room of n tokens takes, `baseBytes + n × bytesPerToken`, and whether decode
       * adds each generated token's KV to the pool: the control plane admits a request only where
       * its pages fit (absent: it cannot count this engine's pages, and does not).
       */
      kv: Type.Optional(
        Type.Object(
          {
            baseBytes: Count,
            bytesPerToken: Type.Integer({ minimum: 1 }),
            decodeGrows: Type.Boolean(),
          },
          strict,
        ),
      ),
      /** The engine's model and KV layout (`ModelInfo.format`); absent: the built-in model. */
      model: Type.Optional(Type.String({ minLength: 1, maxLength: 500 })),
      /** What llama.cpp gave the engine's model, as it reports it; absent: the built-in model. */
      runtime: Type.Optional(ModelRuntimeWire),
      /** The engine's KV pool (shared-memory name) and its epoch; prefill engines have one too. */
      pool: Short,
      epoch: Count,
      /** Highest seq this incarnation has applied; 0 for a fresh start. */
      lastSeq: Seq,
      /** Rooms it still holds pages or work for. */
      rooms: Type.Array(Id, { maxItems: 100_000 }),
      /** It accepts `inject_fault` (`--allow-fault-injection`); absent means no. */
      faultInjection: Type.Optional(Type.Boolean()),
      /** The CUDA device its pool's pages are on (`--kv-device`); absent means host shared memory. */
      kvDevice: Type.Optional(Type.Integer({ minimum: 0, maximum: 1023 })),
      /**
       * Which host it runs on: engines whose `host` is equal share shared memory (boot id and the
       * device of /dev/shm, docs/protocol.md "Across hosts"). Absent: taken for the control plane's.
       */
      host: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
      /** A decode engine that can receive KV over UCX: where a room's KV message is sent. */
      kvRemote: Type.Optional(KvRemoteWire),
      /**
       * How a prefill engine sends KV: `shm` only to engines on its host (`--kv-transport shm`, or
       * `auto` without UCX), `ucx` always over UCX, `auto` shared memory on its host and UCX to
       * others. The control plane pairs it only with decode engines it can reach. Absent: `auto`.
       */
      kvSend: Type.Optional(Type.Union(KV_SEND_CHOICES.map((c) => Type.Literal(c)))),
      /**
       * A prefill engine that keeps a prefix cache (engine/prefix-cache.ts): its block size in
       * tokens and the most blocks it can hold. Absent: it keeps none.
       */
      prefix: Type.Optional(
        Type.Object({ blockTokens: Type.Integer({ minimum: 1 }), capacityBlocks: Count }, strict),
      ),
      /**
       * Proof that the sender holds an allowed key for this engine id (admission.ts). Optional in
       * the schema only so that a hello without it is answered with a clear refusal.
       */
      auth: Type.Optional(
        Type.Object(
          {
            key: Type.String({ minLength: 40, maxLength: 40 }),
            ts: Type.Integer({ minimum: 0 }),
            mac: Type.String({ minLength: 1, maxLength: 100 }),
          },
          strict,
        ),
      ),
    },
    strict,
  ),
  heartbeat: Type.Object(
    {
      /** Receive/work loop tick counters: a counter that stops moving is a frozen loop. */
      ticks: Type.Record(Type.String({ maxLength: 64 }), Count),
      queues: Type.Record(Type.String({ maxLength: 64 }), Count),
      /** Pages a new room could have: free ones and those of cached prefix blocks. */
      freePages: Count,
      /** Prefix blocks its cache holds (prefill engines with one). */
      cachedBlocks: Type.Optional(Count),
      rooms: Count,
      lastSeq: Seq,
      /** `draining`: finishing its rooms before exiting; it gets no new ones. */
      state: Type.Union([
        Type.Literal('starting'),
        Type.Literal('ready'),
        Type.Literal('draining'),
      ]),
    },
    strict,
  ),
  append: Type.Object(
    {
      /** Idempotency key: a retried append with the same id is stored once. */
      eventId: Type.String({ minLength: 1, maxLength: 200 }),
      /** The `session` of the welcome this append is sent under. */
      session: Type.Integer({ minimum: 1 }),
      /** 1, 2, 3, … within the session, without gaps: how the control plane sees a lost append. */
      n: Type.Integer({ minimum: 1 }),
      /** `type`, `room`, `data` of the event; engine and source are set by the control plane. */
      event: Type.Object(
        {
          type: Short,
          room: Id,
          data: Type.Record(Type.String(), Type.Unknown()),
          /**
           * The seq of the committed event whose arrival started the work this append reports
           * (not journaled: the control plane counts commits in sequence with it). Absent when no
           * event started it (a release, a failure a timer found, a room resumed after a restart).
           */
          cause: Type.Optional(Seq),
        },
        strict,
      ),
    },
    strict,
  ),
  tokens: Type.Object(
    {
      room: Id,
      /**
       * Chunk number within the room, from 0, without gaps. Chunk 0 is the answer's first token,
       * from the room's prefill engine (protocol 9); the decode engine's chunks follow from 1.
       */
      index: Count,
      text: Type.String({ maxLength: 1 << 16 }),
      tokens: Count,
      /** The chunk's token ids: a migrated room's context continues from them. */
      ids: Type.Optional(Type.Array(Count, { maxItems: 1 << 16 })),
    },
    strict,
  ),
} as const;

const JournalEventWire = Type.Object(
  {
    seq: Seq,
    ts: Count,
    type: Short,
    room: Type.Union([Id, Type.Null()]),
    engine: Type.Union([Id, Type.Null()]),
    source: Short,
    eventId: Short,
    data: Type.Record(Type.String(), Type.Unknown()),
  },
  strict,
);

export const COMMANDS = [
  'abort_room',
  'free_room',
  'reset_transfer',
  'reset_in_place',
  'inject_fault',
  'drain',
  'undrain',
  'shutdown',
] as const;
export type CommandName = (typeof COMMANDS)[number];

/** Control plane → engine. */
export const CONTROL_MESSAGES = {
  welcome: Type.Object(
    {
      protocol: Type.Integer({ minimum: 1 }),
      engine: Id,
      incarnation: Short,
      /** Names this connection's append stream; appends carry it with their number `n`. */
      session: Type.Integer({ minimum: 1 }),
      /** Events with seq above this, for the engine's rooms, follow as `event` before live ones. */
      replayFrom: Seq,
      replayEvents: Count,
      heartbeatMs: Count,
    },
    strict,
  ),
  ack: Type.Object(
    {
      eventId: Short,
      status: Type.Union([
        Type.Literal('applied'),
        Type.Literal('rejected'),
        Type.Literal('duplicate'),
      ]),
      /** For a duplicate: whether the original was applied or rejected; otherwise null. */
      original: Type.Union([Type.Literal('applied'), Type.Literal('rejected'), Type.Null()]),
      seq: Seq,
      reason: Type.Union([Short, Type.Null()]),
      detail: Type.Union([Type.String({ maxLength: 1000 }), Type.Null()]),
    },
    strict,
  ),
  nack: Type.Object(
    {
      eventId: Type.Union([Short, Type.Null()]),
      code: Type.Union(BUS_ERROR_CODES.map((c) => Type.Literal(c))),
      message: Type.String({ maxLength: 2000 }),
      /** True when the same append may succeed later (journal unavailable). */
      retryable: Type.Boolean(),
    },
    strict,
  ),
  event: Type.Object(
    {
      event: JournalEventWire,
      /**
       * Seq of the previous event sent to this engine (the hello's lastSeq before the first). An
       * engine whose last applied seq differs has missed one: it says hello again to resync.
       */
      prevSeq: Seq,
      /**
       * On `room.created` with a reservation and on `room.bootstrapped`, to its prefill engine:
       * where the decode engine runs and, when it can receive over UCX, where the room's KV is
       * sent (from the decode engine's hello).
       */
      kvPeer: Type.Optional(
        Type.Object(
          {
            host: Type.Optional(Type.String({ maxLength: 200 })),
            ucx: Type.Optional(KvRemoteWire),
          },
          strict,
        ),
      ),
      /** On `room.created`: what the prefill engine needs to compute the KV. */
      request: Type.Optional(
        Type.Object(
          {
            prompt: Type.String({ maxLength: 1 << 20 }),
            /**
             * The context's token ids (prompt, then any generated before a migration), for a
             * model whose tokenizer runs only in the control plane (llama.cpp models).
             */
            tokens: Type.Optional(Type.Array(Count, { maxItems: 1 << 18 })),
            maxTokens: Count,
            /** Tokens already streamed before a migration; decode continues after them. */
            generated: Type.Optional(Type.String({ maxLength: 1 << 20 })),
            /** Stop sequences: decode ends (`finishReason: stop`) once its text contains one. */
            stop: Type.Optional(StopSequences),
            /** Sampling; absent or temperature 0: greedy. */
            sampling: Type.Optional(
              Type.Object(
                {
                  temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 2 })),
                  topP: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1 })),
                  topK: Type.Optional(Type.Integer({ minimum: 0 })),
                  seed: Type.Optional(Type.Integer({ minimum: 0, maximum: 0xffffffff })),
                  frequencyPenalty: Type.Optional(Type.Number({ minimum: -2, maximum: 2 })),
                  presencePenalty: Type.Optional(Type.Number({ minimum: -2, maximum: 2 })),
                },
                strict,
              ),
            ),
          },
          strict,
        ),
      ),
    },
    strict,
  ),
  /**
   * To a room's decode engine, when its prefill engine's `room.transfer_completed` reached the
   * control plane (before it commits): the bytes are in the reserved pages. A hint, not an event
   * — nothing is journaled for it. The decode engine may verify the checksum, load the KV and
   * compute the first token, but holds the token until the event commits (protocol 7).
   */
  kv_arrived: Type.Object(
    {
      room: Id,
      bytes: Count,
      checksum: Short,
      /** The append's `firstToken` (protocol 9): what the decode engine continues after. */
      firstToken: Type.Optional(
        Type.Union([
          Type.Object({ token: Count, text: Type.String({ maxLength: 1024 }) }, strict),
          Type.Null(),
        ]),
      ),
    },
    strict,
  ),
  command: Type.Object(
    {
      command: Type.Union(COMMANDS.map((c) => Type.Literal(c))),
      room: Type.Union([Id, Type.Null()]),
      reason: Type.Union([Short, Type.Null()]),
    },
    strict,
  ),
} as const;

/**
 * Either side may pack several messages to the same peer into one `batch` frame: the items, in
 * order, each a kind and its own msgpack payload (so each is validated on its own). A sender
 * batches what it queued in one event-loop turn; a batch never holds a batch.
 */
export const BATCH_KIND = 'batch';
const BatchSchema = Type.Object(
  {
    items: Type.Array(
      Type.Tuple([Type.String({ minLength: 1, maxLength: 32 }), Type.Uint8Array()]),
      {
        minItems: 1,
        maxItems: 65_536,
      },
    ),
  },
  strict,
);
const batchChecker = TypeCompiler.Compile(BatchSchema);

export type EngineKind = keyof typeof ENGINE_MESSAGES;
export type ControlKind = keyof typeof CONTROL_MESSAGES;
export type EngineMessage<K extends EngineKind> = Static<(typeof ENGINE_MESSAGES)[K]>;
export type ControlMessage<K extends ControlKind> = Static<(typeof CONTROL_MESSAGES)[K]>;
export type RoomRequest = NonNullable<ControlMessage<'event'>['request']>;

/** Why a frame was dropped or nacked; each is a counter in heartbeats, metrics and logs. */
export type DropReason =
  | 'bad_frame_count'
  | 'unknown_kind'
  | 'too_large'
  | 'bad_msgpack'
  | 'bad_payload'
  | 'not_registered'
  | 'unknown_room'
  | 'duplicate'
  | 'stale_session'
  | 'out_of_order'
  /** A hello whose admission proof failed (admission.ts). */
  | 'unauthorized'
  /** An append for a room the engine does not hold, or of a type its role never sends. */
  | 'not_owner'
  /** An engine's appends were refused faster than the journal records refusals. */
  | 'rate_limited';

export type Decoded<K extends string> =
  | { ok: true; kind: K; payload: Record<string, unknown> }
  | { ok: false; reason: DropReason; kind: string | null; detail: string };

type Checker = {
  Check(v: unknown): boolean;
  Errors(v: unknown): Iterable<{ path: string; message: string }>;
};

function compile(schemas: Record<string, TSchema>): Map<string, Checker> {
  return new Map(
    Object.entries(schemas).map(([k, s]) => [k, TypeCompiler.Compile(s) as unknown as Checker]),
  );
}

const packr = new Packr({ useRecords: false, mapsAsObjects: true, moreTypes: false });

export function encodePayload(payload: unknown): Buffer {
  return packr.pack(payload);
}

/** The `batch` payload for messages already encoded one by one. */
export function encodeBatch(items: ReadonlyArray<readonly [string, Buffer]>): Buffer {
  return packr.pack({ items });
}

/** One decoder per direction: it knows which kinds it accepts. */
export class FrameDecoder<K extends string> {
  private readonly checkers: Map<string, Checker>;

  constructor(
    schemas: Record<K, TSchema>,
    readonly maxFrameBytes: number = DEFAULT_MAX_FRAME_BYTES,
  ) {
    this.checkers = compile(schemas);
  }

  /**
   * `frames` without the routing id: one message, or every item of a batch, in order. Never
   * throws; each bad item comes back as its own reason.
   */
  decodeAll(frames: readonly Buffer[]): Decoded<K>[] {
    if (frames.length !== 2 || frames[0]?.toString('latin1') !== BATCH_KIND)
      return [this.decode(frames)];
    const body = frames[1] as Buffer;
    if (body.length > this.maxFrameBytes) {
      return [
        {
          ok: false,
          reason: 'too_large',
          kind: BATCH_KIND,
          detail: `${body.length} B batch, limit ${this.maxFrameBytes} B`,
        },
      ];
    }
    let batch: unknown;
    try {
      batch = packr.unpack(body);
    } catch (err) {
      return [
        { ok: false, reason: 'bad_msgpack', kind: BATCH_KIND, detail: (err as Error).message },
      ];
    }
    if (!batchChecker.Check(batch)) {
      const first = [...batchChecker.Errors(batch)][0];
      return [
        {
          ok: false,
          reason: 'bad_payload',
          kind: BATCH_KIND,
          detail: first ? `${first.path || '/'} ${first.message}` : 'not a batch',
        },
      ];
    }
    return (batch as { items: Array<[string, Uint8Array]> }).items.map(([kind, payload]) =>
      kind === BATCH_KIND
        ? { ok: false, reason: 'bad_payload', kind, detail: 'a batch inside a batch' }
        : this.decode([
            Buffer.from(kind, 'latin1'),
            Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength),
          ]),
    );
  }

  /** One `[kind, payload]` message, without the routing id. Never throws. */
  decode(frames: readonly Buffer[]): Decoded<K> {
    if (frames.length !== 2) {
      return {
        ok: false,
        reason: 'bad_frame_count',
        kind: null,
        detail: `${frames.length} frames, want 2`,
      };
    }
    const [kindBuf, body] = frames as [Buffer, Buffer];
    if (kindBuf.length > 32) {
      return {
        ok: false,
        reason: 'unknown_kind',
        kind: null,
        detail: `kind frame of ${kindBuf.length} B`,
      };
    }
    const kind = kindBuf.toString('latin1');
    const checker = this.checkers.get(kind);
    if (!checker)
      return { ok: false, reason: 'unknown_kind', kind: printable(kind), detail: 'no such kind' };
    if (body.length > this.maxFrameBytes) {
      return {
        ok: false,
        reason: 'too_large',
        kind,
        detail: `${body.length} B payload, limit ${this.maxFrameBytes} B`,
      };
    }
    let payload: unknown;
    try {
      payload = packr.unpack(body);
    } catch (err) {
      return { ok: false, reason: 'bad_msgpack', kind, detail: (err as Error).message };
    }
    if (!checker.Check(payload)) {
      const first = [...checker.Errors(payload)][0];
      return {
        ok: false,
        reason: 'bad_payload',
        kind,
        detail: first ? `${first.path || '/'} ${first.message}` : 'does not match its schema',
      };
    }
    return { ok: true, kind: kind as K, payload: payload as Record<string, unknown> };
  }
}

function printable(s: string): string {
  return JSON.stringify(s.replace(/[^\x20-\x7e]/g, '?').slice(0, 32));
}

export const engineFrames = (maxFrameBytes?: number) =>
  new FrameDecoder<EngineKind>(ENGINE_MESSAGES, maxFrameBytes);
export const controlFrames = (maxFrameBytes?: number) =>
  new FrameDecoder<ControlKind>(CONTROL_MESSAGES, maxFrameBytes);
