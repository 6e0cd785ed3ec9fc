/**
 * Response schemas of the HTTP API: what each route promises to answer, published in the OpenAPI
 * document (`/docs`) and checked against real answers by test/api-schemas.e2e.test.ts. Responses
 * are serialized with JSON.stringify, never through these schemas, so a field the schema does not
 * name still reaches the client; objects whose content is open (event data, statistics) say so.
 */
import { type TSchema, Type } from '@sinclair/typebox';
import { KV_SEND_CHOICES } from '../bus/protocol.ts';
import { ENGINE_STATUSES } from '../control/engines/engine-view.ts';
import { EVENT_TYPES } from '../room/events.ts';
import { ROOM_STATES } from '../room/states.ts';

const Nullable = <T extends TSchema>(t: T) => Type.Union([t, Type.Null()]);
const Open = { additionalProperties: true };

/** Every error, in OpenAI's shape. */
export const ErrorBody = Type.Object(
  {
    error: Type.Object({
      message: Type.String(),
      type: Type.String(),
      param: Nullable(Type.String()),
      code: Nullable(Type.String()),
    }),
  },
  { $id: 'Error', description: 'An error in the shape OpenAI clients expect' },
);

/** The error answers every route may give. */
export const Errors = { '4xx': Type.Ref('Error'), '5xx': Type.Ref('Error') };

const RoomState = Type.Union(ROOM_STATES.map((s) => Type.Literal(s)));

export const RoomSchema = Type.Object(
  {
    room: Type.String(),
    state: RoomState,
    prefillEngine: Type.String(),
    decodeEngine: Type.String(),
    createdAt: Type.Integer({ description: 'unix ms' }),
    updatedAt: Type.Integer(),
    stateSince: Type.Integer({ description: 'when the current state was entered (unix ms)' }),
    deadlineAt: Nullable(Type.Integer({ description: "the current state's deadline (unix ms)" })),
    terminalAt: Nullable(Type.Integer()),
    deadlinesMs: Type.Record(Type.String(), Type.Integer()),
    promptTokens: Nullable(Type.Integer()),
    maxTokens: Nullable(Type.Integer()),
    migratedFrom: Nullable(Type.String()),
    migratedTo: Nullable(Type.String()),
    kvPages: Nullable(Type.Integer()),
    transferBytes: Nullable(Type.Integer()),
    transferMicros: Nullable(Type.Number()),
    checksum: Nullable(Type.String()),
    tokens: Nullable(Type.Integer()),
    finishReason: Nullable(Type.String()),
    reason: Nullable(Type.String({ description: 'why it was aborted or failed' })),
    abortSource: Nullable(Type.String()),
    failedStage: Nullable(Type.String()),
    detectedBy: Nullable(Type.String()),
    abortRequestedAt: Nullable(Type.Integer()),
    abortReason: Nullable(Type.String()),
    releasedBy: Type.Array(Type.String()),
    lastSeq: Type.Integer(),
    eventCount: Type.Integer(),
    origin: Type.String({ description: 'who created it: api, canary, migration, …' }),
    requestId: Nullable(
      Type.String({
        description:
          "the HTTP request it serves (the client's x-request-id, or the one the API made)",
      }),
    ),
    tenant: Nullable(
      Type.String({ description: 'the tenant whose key its request came with; null: an open API' }),
    ),
  },
  { $id: 'Room', description: 'The projection of one room: the fold of its events' },
);

export const EventSchema = Type.Object(
  {
    seq: Type.Integer(),
    ts: Type.Integer({ description: 'unix ms' }),
    type: Type.Union(EVENT_TYPES.map((t) => Type.Literal(t))),
    room: Nullable(Type.String()),
    engine: Nullable(Type.String()),
    source: Type.String(),
    eventId: Type.String(),
    data: Type.Object({}, Open),
  },
  { $id: 'Event', description: 'One committed journal event' },
);

export const RoomPageBody = Type.Object({
  rooms: Type.Array(Type.Ref('Room')),
  nextCursor: Nullable(Type.String({ description: 'pass as ?cursor= for the next page' })),
  refusals: Type.Optional(
    Type.Array(Type.Ref('Event'), {
      description:
        'with request_id and no room: the request.refused events that list the request (it was refused before it had a room)',
    }),
  ),
  refusalText: Type.Optional(
    Type.Array(Type.String(), {
      description:
        'each of refusals as `pdctl room ID` says it: refused at T: status reason — message',
    }),
  ),
});

export const LiveBody = Type.Object({
  counts: Type.Record(Type.String(), Type.Integer(), {
    description: 'rooms in each live state now',
  }),
  total: Type.Integer(),
  rooms: Type.Array(Type.Ref('Room'), {
    description: 'live rooms, longest in their current state first, at most limit',
  }),
});

export const TimelineBody = Type.Object({
  room: Nullable(Type.Ref('Room')),
  events: Type.Array(Type.Ref('Event')),
  spans: Type.Array(
    Type.Object({
      state: RoomState,
      from: Type.Integer(),
      to: Nullable(Type.Integer()),
      ms: Nullable(Type.Number()),
    }),
  ),
});

const LadderView = Type.Object({
  phase: Type.String(),
  reason: Nullable(Type.String()),
  detectedAt: Nullable(Type.Integer()),
  resets: Type.Integer(),
  restarts: Type.Integer(),
  lastOutcome: Nullable(Type.String()),
});

export const EnginesBody = Type.Object({
  engines: Type.Array(
    Type.Object({
      id: Type.String(),
      role: Type.Union([Type.Literal('prefill'), Type.Literal('decode')]),
      status: Type.Union(
        ENGINE_STATUSES.map((x) => Type.Literal(x)),
        {
          description:
            "the control plane's one verdict (docs/design.md §10): connecting, live (takes rooms), draining, stale (no heartbeat for the stale limit: no rooms), stalled (the ladder acts)",
        },
      ),
      state: Type.String({
        description:
          'what the engine says of itself: connecting, starting, ready, draining, stopped',
      }),
      pid: Type.Integer(),
      incarnation: Type.String(),
      connectedAt: Type.Integer(),
      heartbeatAgeMs: Type.Integer(),
      heartbeats: Type.Integer(),
      loopTicks: Type.Record(Type.String(), Type.Integer()),
      queues: Type.Record(Type.String(), Type.Integer()),
      freePages: Nullable(Type.Integer()),
      totalPages: Type.Integer(),
      pageBytes: Type.Integer(),
      roomsHeld: Nullable(Type.Integer()),
      liveRooms: Type.Integer(),
      pool: Type.String(),
      kvDevice: Nullable(Type.Integer()),
      host: Nullable(
        Type.String({
          description:
            'which host it runs on (boot id and /dev/shm device): engines with equal host share shared memory',
        }),
      ),
      hostTag: Nullable(
        Type.String({ description: 'a short tag of `host` for people: equal tags, one host' }),
      ),
      kvUcx: Type.Boolean({ description: 'it receives KV over UCX from engines on other hosts' }),
      kvSend: Type.Union(
        KV_SEND_CHOICES.map((c) => Type.Literal(c)),
        {
          description:
            'how it sends KV: shm (only to engines on its host), ucx (always), auto (shared memory on its host, UCX to others)',
        },
      ),
      transfers: Type.Record(Type.String(), Type.Integer(), {
        description:
          'KV transfers it took part in since the control plane started, by transport (shm, cuda, ucx)',
      }),
      faultInjection: Type.Boolean(),
      runtime: Nullable(
        Type.Object(
          {
            contextSize: Type.Integer(),
            threads: Type.Integer(),
            gpu: Type.String({ description: 'the GPU backend llama.cpp runs on, or cpu' }),
          },
          {
            description:
              'what llama.cpp reports it gave the engine’s model (--context-size, --threads, --gpu); null: the built-in model',
          },
        ),
      ),
      recovery: Nullable(LadderView),
      restarts: Nullable(Type.Integer()),
      ejection: Nullable(
        Type.Object(
          {
            reason: Type.String(),
            since: Type.Integer(),
            until: Type.Integer({ description: 'when a canary through it may first be tried' }),
            times: Type.Integer(),
          },
          {
            description:
              'why it is out of rotation as an outlier until a canary through it passes (null: in rotation)',
          },
        ),
      ),
      cordon: Nullable(
        Type.Object(
          {
            reason: Type.String(),
            by: Type.String({ description: 'ladder or operator' }),
            evidence: Nullable(Type.String()),
            at: Type.Integer(),
          },
          {
            description:
              'why it takes no new rooms until `pdctl engines uncordon` (null: not cordoned)',
          },
        ),
      ),
    }),
  ),
});

export const UsageBody = Type.Object({
  since: Type.Integer({ description: 'the window, unix ms' }),
  until: Type.Integer(),
  tenants: Type.Array(
    Type.Object({
      tenant: Type.Union([Type.String(), Type.Null()], {
        description: 'null: requests that came with no key (an open API)',
      }),
      requests: Type.Integer({ description: 'answered: a room of theirs completed' }),
      refused: Type.Integer({ description: 'refused before any room (429, 503)' }),
      failed: Type.Integer({
        description: 'had a room but no answer (failed, aborted, client left)',
      }),
      promptTokens: Type.Integer(),
      completionTokens: Type.Integer(),
      waitedMs: Type.Integer({ description: "time waited in flow control's queue" }),
    }),
  ),
});

export const StatsBody = Type.Object({
  journal: Type.Object({ path: Type.String(), events: Type.Integer() }, Open),
  health: Type.Object({ state: Type.String(), writable: Type.Boolean() }, Open),
  control: Type.Object({}, Open),
  /** The retention of this control plane: policy (null: none), the pass running, the last, totals. */
  retention: Type.Union([Type.Object({ policy: Type.Unknown() }, Open), Type.Null()]),
  bus: Type.Object(
    {
      endpoint: Type.String(),
      dropped: Type.Record(Type.String(), Type.Integer()),
      loop: Type.Object({
        ticks: Type.Integer(),
        restarts: Type.Integer(),
        running: Type.Boolean(),
      }),
      outbox: Type.Integer(),
    },
    Open,
  ),
});

const Check = Type.Object({ ok: Type.Boolean(), detail: Type.String() });
export const ReadyBody = Type.Object({
  status: Type.Union([Type.Literal('ready'), Type.Literal('not_ready')]),
  checks: Type.Record(Type.String(), Check),
});

export const CanaryBody = Type.Object({
  status: Type.Union([Type.Literal('ok'), Type.Literal('failing')]),
  ok: Type.Boolean(),
  room: Nullable(Type.String()),
  ms: Type.Number(),
  stages: Type.Record(Type.String(), Type.Number()),
  stage: Nullable(Type.String({ description: 'where it stopped, when failing' })),
  reason: Nullable(Type.String()),
  failure: Nullable(
    Type.String({
      description: "the canary room's failure reason (docs/design.md §3), when the room failed",
    }),
  ),
  at: Type.Integer(),
});

export const ModelsBody = Type.Object({
  object: Type.Literal('list'),
  data: Type.Array(
    Type.Object({
      id: Type.String(),
      object: Type.Literal('model'),
      created: Type.Integer(),
      owned_by: Type.String(),
    }),
  ),
});

const Usage = Type.Object({
  prompt_tokens: Type.Integer(),
  completion_tokens: Type.Integer(),
  total_tokens: Type.Integer(),
});
const FinishReason = Nullable(Type.String({ description: 'stop or length' }));

export const CompletionResponse = Type.Object({
  id: Type.String({ description: 'cmpl-<room>' }),
  object: Type.Literal('text_completion'),
  created: Type.Integer(),
  model: Type.String(),
  choices: Type.Array(
    Type.Object({
      index: Type.Integer(),
      text: Type.String(),
      logprobs: Type.Null(),
      finish_reason: FinishReason,
    }),
  ),
  usage: Usage,
  pdctl_room: Type.String({ description: 'the room that served it: GET /v1/rooms/{room}' }),
});

export const ChatCompletionResponse = Type.Object({
  id: Type.String({ description: 'chatcmpl-<room>' }),
  object: Type.Literal('chat.completion'),
  created: Type.Integer(),
  model: Type.String(),
  choices: Type.Array(
    Type.Object({
      index: Type.Integer(),
      message: Type.Object({
        role: Type.Literal('assistant'),
        content: Type.String(),
        refusal: Type.Null(),
      }),
      logprobs: Type.Null(),
      finish_reason: FinishReason,
    }),
  ),
  usage: Usage,
  pdctl_room: Type.String(),
});

/** Schemas that routes refer to by `$ref`; registered once with `app.addSchema`. */
export const SHARED_SCHEMAS = [ErrorBody, RoomSchema, EventSchema];
