/**
 * The OpenAI-compatible routes: `POST /v1/completions`, `POST /v1/chat/completions` (streaming
 * or not) and `GET /v1/models`, close enough that the official `openai` client works unchanged.
 * Every response names its room (`x-pdctl-room`, and `id` = `cmpl-<room>`), so a bad answer leads
 * straight to its timeline. A client that goes away aborts its room at once.
 */
import { randomInt } from 'node:crypto';
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsync, FastifyReply, FastifyRequest } from 'fastify';
import { STOP_SEQUENCES, StopSequences } from '../bus/protocol.ts';
import type { ControlPlane } from '../control/control-plane.ts';
import type { FlowControl } from '../control/flow/flow-control.ts';
import { RoomEndedError, type RoomStream } from '../control/intake/streams.ts';
import type { CompletionResult } from '../control/intake/types.ts';
import { MAX_TOKENS_LIMIT } from '../control/options.ts';
import type { ChatMessage, Sampling } from '../model/executor.ts';
import type { Tenant, TenantBook } from '../tenants/book.ts';
import { bearerOf } from './access.ts';
import { ApiError, toApiError } from './errors.ts';
import type { ApiMetrics } from './metrics.ts';
import { ChatCompletionResponse, CompletionResponse, Errors, ModelsBody } from './schemas.ts';
import { SHUTDOWN_REASON, type ShutdownGate } from './shutdown.ts';

/**
 * Sampling as the OpenAI API defines it, honoured by a llama.cpp model: temperature 1, top_p 1
 * and no top_k unless asked (`top_k` is not OpenAI's but most servers'), a seed drawn for each
 * request that sends none, and the frequency and presence penalties. The built-in deterministic
 * model's text is fixed: it refuses penalties rather than ignore them.
 */
const Penalty = Type.Optional(Type.Union([Type.Number({ minimum: -2, maximum: 2 }), Type.Null()]));
const SAMPLING = {
  temperature: Type.Optional(Type.Union([Type.Number({ minimum: 0, maximum: 2 }), Type.Null()])),
  top_p: Type.Optional(Type.Union([Type.Number({ exclusiveMinimum: 0, maximum: 1 }), Type.Null()])),
  top_k: Type.Optional(Type.Union([Type.Integer({ minimum: 0 }), Type.Null()])),
  seed: Type.Optional(Type.Union([Type.Integer({ minimum: 0, maximum: 0xffffffff }), Type.Null()])),
  frequency_penalty: Penalty,
  presence_penalty: Penalty,
};

/** `user` is the client's label for its end user: accepted, not used. `logit_bias`: refused unless empty. */
const IGNORED = {
  user: Type.Optional(Type.String()),
  logit_bias: Type.Optional(Type.Union([Type.Record(Type.String(), Type.Number()), Type.Null()])),
};

const Stop = Type.Optional(
  Type.Union([
    Type.String({ minLength: 1, maxLength: STOP_SEQUENCES.maxLength }),
    StopSequences,
    Type.Null(),
  ]),
);
const Common = {
  model: Type.String({ minLength: 1, maxLength: 200 }),
  max_tokens: Type.Optional(
    Type.Union([Type.Integer({ minimum: 1, maximum: MAX_TOKENS_LIMIT }), Type.Null()]),
  ),
  max_completion_tokens: Type.Optional(
    Type.Union([Type.Integer({ minimum: 1, maximum: MAX_TOKENS_LIMIT }), Type.Null()]),
  ),
  n: Type.Optional(Type.Union([Type.Literal(1), Type.Null()])),
  stream: Type.Optional(Type.Union([Type.Boolean(), Type.Null()])),
  stream_options: Type.Optional(
    Type.Union([Type.Object({ include_usage: Type.Optional(Type.Boolean()) }), Type.Null()]),
  ),
  stop: Stop,
  ...SAMPLING,
  ...IGNORED,
};

export const CompletionBody = Type.Object(
  {
    ...Common,
    prompt: Type.Union([
      Type.String({ minLength: 1 }),
      Type.Array(Type.String({ minLength: 1 }), { minItems: 1, maxItems: 1 }),
    ]),
  },
  { additionalProperties: false },
);

const Message = Type.Object(
  {
    role: Type.Union([
      Type.Literal('system'),
      Type.Literal('user'),
      Type.Literal('assistant'),
      Type.Literal('developer'),
    ]),
    content: Type.Union([
      Type.String(),
      Type.Array(
        Type.Object(
          { type: Type.Literal('text'), text: Type.String() },
          { additionalProperties: false },
        ),
      ),
    ]),
    name: Type.Optional(Type.String()),
  },
  { additionalProperties: false },
);
export const ChatBody = Type.Object(
  { ...Common, messages: Type.Array(Message, { minItems: 1, maxItems: 1000 }) },
  { additionalProperties: false },
);

type CompletionRequest = Static<typeof CompletionBody>;
type ChatRequest = Static<typeof ChatBody>;

/** OpenAI's default when max_tokens is absent. */
const DEFAULT_MAX_TOKENS = 16;

/** A chat's messages as the model's template takes them: content parts joined by spaces. */
function chatMessages(messages: ChatRequest['messages']): ChatMessage[] {
  return messages.map((m) => ({
    role: m.role,
    content: typeof m.content === 'string' ? m.content : m.content.map((p) => p.text).join(' '),
  }));
}

/** A W3C traceparent header, when it is one (version 00 or later, ids not all zero). */
function traceparentOf(header: string | string[] | undefined): { traceparent?: string } {
  if (typeof header !== 'string') return {};
  const m = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(header.trim());
  if (!m || m[1] === 'ff' || /^0+$/.test(m[2] as string) || /^0+$/.test(m[3] as string)) return {};
  return { traceparent: header.trim() };
}

/** The request's sampling, as the engines take it. */
function sampling(body: CompletionRequest | ChatRequest, samples: boolean): Sampling {
  if (body.logit_bias && Object.keys(body.logit_bias).length > 0)
    throw ApiError.of(
      'unsupported_parameter',
      'logit_bias is not supported by pdctl; send the request without it',
      'logit_bias',
    );
  for (const name of ['frequency_penalty', 'presence_penalty'] as const)
    if (!samples && (body[name] ?? 0) !== 0)
      throw ApiError.of(
        'unsupported_parameter',
        `${name} needs a model that samples; the built-in deterministic model's text is fixed (serve a llama.cpp model with --model)`,
        name,
      );
  return {
    temperature: body.temperature ?? 1,
    ...(body.top_p == null ? {} : { topP: body.top_p }),
    ...(body.top_k == null ? {} : { topK: body.top_k }),
    // A request without a seed draws its own (journaled on room.created): never the clock's.
    seed: body.seed ?? randomInt(0, 2 ** 31),
    ...(body.frequency_penalty ? { frequencyPenalty: body.frequency_penalty } : {}),
    ...(body.presence_penalty ? { presencePenalty: body.presence_penalty } : {}),
  };
}

/**
 * How many characters at the end of `text` could be the start of a stop sequence still to come:
 * they are held back until the next chunk says whether the stop follows.
 */
function partialStop(text: string, stops: string[]): number {
  let held = 0;
  for (const s of stops)
    for (let k = Math.min(s.length - 1, text.length); k > held; k--)
      if (text.endsWith(s.slice(0, k))) {
        held = k;
        break;
      }
  return held;
}

/** Where the first stop sequence starts in `text`, or -1. */
function stopAt(text: string, stops: string[]): number {
  let at = -1;
  for (const s of stops) {
    const i = text.indexOf(s);
    if (i >= 0 && (at < 0 || i < at)) at = i;
  }
  return at;
}

export interface OpenAiDeps {
  control: ControlPlane;
  metrics: ApiMetrics;
  modelId: string;
  /** Set when the API shuts down: new completions are refused, those in flight are tracked. */
  shutdown: ShutdownGate;
  /** Flow control: a request that cannot be served now waits its turn (control/flow/). */
  flow: FlowControl;
}

/** The client's own time-to-live in flow control's queue, in ms: its band's, or less. */
export const QUEUE_TTL_HEADER = 'x-pdctl-queue-ttl-ms';

/** The header's value (absent: null); one that is not a whole number of ms is a 400. */
function queueTtlOf(req: FastifyRequest): number | null {
  const v = req.headers[QUEUE_TTL_HEADER];
  if (v === undefined) return null;
  const ms = typeof v === 'string' && /^\d{1,9}$/.test(v.trim()) ? Number(v) : Number.NaN;
  if (!Number.isInteger(ms))
    throw ApiError.of(
      'invalid_parameter',
      `${QUEUE_TTL_HEADER} must be a whole number of milliseconds (0: do not wait), got ${JSON.stringify(v)}`,
      QUEUE_TTL_HEADER,
    );
  return ms;
}

/** `response` of a completion route: JSON, or server-sent events with `stream: true`. */
function completionResponse(json: typeof CompletionResponse | typeof ChatCompletionResponse) {
  return {
    200: {
      description:
        'The completion; with "stream": true, server-sent events (`data: {chunk}` lines, then `data: [DONE]`)',
      content: {
        'application/json': { schema: json },
        'text/event-stream': { schema: Type.String() },
      },
    },
    ...Errors,
  };
}

/** The tenant each serving request's key named (null: the API is open), for `serve`. */
const tenantOfRequest = new WeakMap<FastifyRequest, Tenant | null>();

/**
 * The tenant a serving request's key names. While no tenant was ever added the API is open (null);
 * after, a live tenant's key is needed — none, a wrong one, one rotated out or revoked: 401
 * `invalid_api_key`, as OpenAI answers it. The message never repeats the key.
 */
function authenticate(req: FastifyRequest, book: TenantBook): Tenant | null {
  if (!book.closed) return null;
  const bearer = bearerOf(req);
  if (bearer === undefined) {
    throw ApiError.of(
      'invalid_api_key',
      'this API needs a key: send the header Authorization: Bearer KEY (an operator makes one with pdctl tenants add NAME)',
    );
  }
  const tenant = book.authenticate(bearer);
  if (!tenant) {
    throw ApiError.of(
      'invalid_api_key',
      'the API key is not valid (wrong, rotated out or revoked); ask the operator for a current one',
    );
  }
  return tenant;
}

/** `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`. */
export const openAiRoutes: FastifyPluginAsync<OpenAiDeps> = async (app, deps) => {
  const created = Math.floor(Date.now() / 1000);
  // Before the body is read: a caller without a key costs a header's parse, not a 1 MiB body's.
  app.addHook('onRequest', async (req) => {
    tenantOfRequest.set(req, authenticate(req, deps.control.tenants));
  });
  app.get(
    '/v1/models',
    {
      schema: {
        tags: ['serving'],
        summary: 'The model this stack serves',
        response: { 200: ModelsBody },
      },
    },
    async () => ({
      object: 'list',
      data: [{ id: deps.modelId, object: 'model', created, owned_by: 'pdctl' }],
    }),
  );

  app.post<{ Body: CompletionRequest }>(
    '/v1/completions',
    {
      schema: {
        tags: ['serving'],
        summary: 'Text completion (OpenAI-compatible)',
        body: CompletionBody,
        response: completionResponse(CompletionResponse),
      },
    },
    (req, reply) =>
      serve(req, reply, deps, 'text', {
        prompt: Array.isArray(req.body.prompt) ? (req.body.prompt[0] as string) : req.body.prompt,
      }),
  );
  app.post<{ Body: ChatRequest }>(
    '/v1/chat/completions',
    {
      schema: {
        tags: ['serving'],
        summary: 'Chat completion (OpenAI-compatible)',
        body: ChatBody,
        response: completionResponse(ChatCompletionResponse),
      },
    },
    (req, reply) => {
      let prompt: { prompt: string; tokens: number[] };
      try {
        prompt = deps.control.modelInfo.chat(chatMessages(req.body.messages));
      } catch (err) {
        throw ApiError.of(
          'invalid_messages',
          `the messages do not fit the model's chat template: ${(err as Error).message}`,
          'messages',
        );
      }
      return serve(req, reply, deps, 'chat', prompt);
    },
  );
};

type Kind = 'text' | 'chat';

/**
 * A room that ended without completing: 409 when it was aborted, 503 when it failed or the
 * server cut it at its shutdown's drain deadline (retry elsewhere).
 */
function roomEnded(err: RoomEndedError): ApiError {
  const message = `${err.message}; its timeline: GET /v1/rooms/${err.room}`;
  if (err.state === 'aborted' && err.reason === SHUTDOWN_REASON)
    return ApiError.of(
      'shutdown',
      `pdctl is shutting down and cut this request at its drain deadline; retry it (room ${err.room})`,
    );
  return err.state === 'aborted'
    ? ApiError.of('room_aborted', message)
    : new ApiError(503, message, 'server_error', `room_${err.state}`);
}

/** The tenant a serving request came with (null: an open API), for the refusal log. */
export function requestTenant(req: FastifyRequest): string | null {
  return tenantOfRequest.get(req)?.name ?? null;
}

async function serve(
  req: FastifyRequest<{ Body: CompletionRequest | ChatRequest }>,
  reply: FastifyReply,
  deps: OpenAiDeps,
  kind: Kind,
  input: { prompt: string; tokens?: number[] },
): Promise<FastifyReply> {
  const body = req.body;
  if (body.model !== deps.modelId) {
    throw ApiError.of(
      'model_not_found',
      `the model \`${body.model}\` does not exist; this stack serves \`${deps.modelId}\` (GET /v1/models)`,
      'model',
    );
  }
  const maxTokens = body.max_completion_tokens ?? body.max_tokens ?? DEFAULT_MAX_TOKENS;
  const stops = body.stop == null ? [] : Array.isArray(body.stop) ? body.stop : [body.stop];
  const asked = sampling(body, deps.control.modelInfo.samples);
  if (deps.shutdown.closing)
    throw ApiError.of(
      'shutting_down',
      'pdctl is shutting down: requests in flight finish, new ones are refused; send it to another control plane',
    );
  const ac = new AbortController();
  const started = performance.now();
  const tenant = tenantOfRequest.get(req) ?? null;
  const ttlMs = queueTtlOf(req);
  // The socket closing before we finished is the client going away: it waits no more, and its
  // room, once it has one, is aborted.
  let finished = false;
  reply.raw.on('close', () => {
    if (!finished) ac.abort();
  });
  let stream: RoomStream;
  try {
    stream = await deps.flow.admit({
      ...input,
      maxTokens,
      stop: stops,
      sampling: asked,
      requestId: req.id,
      ...traceparentOf(req.headers.traceparent),
      tenant,
      ...(ttlMs === null ? {} : { ttlMs }),
      signal: ac.signal,
    });
  } catch (err) {
    if (ac.signal.aborted) throw new ApiError(499, 'the client left while its request waited');
    throw err;
  } finally {
    if (tenant) reply.headers(deps.flow.limits.headers(tenant, Date.now()));
  }
  reply.header('x-pdctl-room', stream.room);
  // The access line names the room serving the request when it ends (a migration moves it).
  req.room = () => stream.current;
  const leave = deps.shutdown.enter(() => stream.current);
  reply.raw.once('close', leave);
  const id = `${kind === 'chat' ? 'chatcmpl' : 'cmpl'}-${stream.room}`;
  const createdAt = Math.floor(Date.now() / 1000);
  const usage = (r: { tokens: number }) => ({
    prompt_tokens: stream.promptTokens,
    completion_tokens: r.tokens,
    total_tokens: stream.promptTokens + r.tokens,
  });
  try {
    if (!body.stream) {
      const result = await stream.result;
      finished = true;
      deps.metrics.completed(kind, performance.now() - started);
      deps.metrics.answered(tenant?.name ?? null, stream.promptTokens, result.tokens);
      const cut = stops.length > 0 ? stopAt(result.text, stops) : -1;
      const text = cut >= 0 ? result.text.slice(0, cut) : result.text;
      const finish = cut >= 0 ? 'stop' : result.finishReason;
      const choice =
        kind === 'chat'
          ? {
              index: 0,
              message: { role: 'assistant', content: text, refusal: null },
              logprobs: null,
              finish_reason: finish,
            }
          : { index: 0, text, logprobs: null, finish_reason: finish };
      return reply.send({
        id,
        object: kind === 'chat' ? 'chat.completion' : 'text_completion',
        created: createdAt,
        model: deps.modelId,
        choices: [choice],
        usage: usage(result),
        pdctl_room: stream.room,
      });
    }
    // The stream's 200 goes out only once the room is journaled; a refused room is a 503 here.
    await stream.admitted;
    return await streamSse(reply, deps, kind, stream, {
      id,
      createdAt,
      stops,
      started,
      includeUsage: body.stream_options?.include_usage === true,
      usage,
      tenant: tenant?.name ?? null,
      onDone: () => (finished = true),
    });
  } catch (err) {
    finished = true;
    // A room that ended without an answer (a room refused before it began is a refusal).
    if (err instanceof RoomEndedError || ac.signal.aborted)
      deps.metrics.unanswered(tenant?.name ?? null);
    if (err instanceof RoomEndedError) throw roomEnded(err);
    throw err;
  }
}

async function streamSse(
  reply: FastifyReply,
  deps: OpenAiDeps,
  kind: Kind,
  stream: RoomStream,
  o: {
    id: string;
    createdAt: number;
    stops: string[];
    started: number;
    includeUsage: boolean;
    usage: (r: { tokens: number }) => Record<string, number>;
    /** Whose request it is, for the per-tenant counters. */
    tenant: string | null;
    onDone: () => void;
  },
): Promise<FastifyReply> {
  reply.hijack();
  const raw = reply.raw;
  raw.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache',
    connection: 'keep-alive',
    'x-pdctl-room': stream.room,
    'x-request-id': reply.request.id,
  });
  // Headers now, not with the first token: the client learns its room at once.
  raw.flushHeaders();
  const object = kind === 'chat' ? 'chat.completion.chunk' : 'text_completion';
  const send = (choice: Record<string, unknown> | null, extra: Record<string, unknown> = {}) =>
    raw.write(
      `data: ${JSON.stringify({ id: o.id, object, created: o.createdAt, model: deps.modelId, choices: choice ? [choice] : [], ...extra })}\n\n`,
    );
  const piece = (text: string, finish: string | null) =>
    kind === 'chat'
      ? {
          index: 0,
          delta: finish === null ? { content: text } : {},
          logprobs: null,
          finish_reason: finish,
        }
      : { index: 0, text, logprobs: null, finish_reason: finish };
  if (kind === 'chat')
    send({
      index: 0,
      delta: { role: 'assistant', content: '' },
      logprobs: null,
      finish_reason: null,
    });
  // `text` is all that arrived; `sent` how much of it the client has. With stop sequences, the
  // end that could be the start of one is held back until the next chunk settles it, so no part
  // of a stop sequence ever reaches the client.
  let text = '';
  let sent = 0;
  let first = true;
  let stopped = false;
  try {
    let lastAt = 0;
    for await (const chunk of stream) {
      const now = performance.now();
      if (first) {
        deps.metrics.firstToken(now - o.started);
        first = false;
      } else deps.metrics.chunkAfter(now - lastAt, chunk.tokens);
      lastAt = now;
      if (stopped) continue;
      text += chunk.text;
      if (o.stops.length === 0) {
        send(piece(chunk.text, null));
        sent = text.length;
        continue;
      }
      const cut = stopAt(text, o.stops);
      const upTo = cut >= 0 ? cut : text.length - partialStop(text, o.stops);
      if (upTo > sent) send(piece(text.slice(sent, upTo), null));
      sent = Math.max(sent, upTo);
      if (cut >= 0) stopped = true;
    }
    const result: CompletionResult = await stream.result;
    // The room ended without a stop: what was held back was not one.
    if (!stopped && sent < text.length) send(piece(text.slice(sent), null));
    o.onDone();
    deps.metrics.completed(kind, performance.now() - o.started);
    deps.metrics.answered(o.tenant, stream.promptTokens, result.tokens);
    send(piece('', stopped ? 'stop' : result.finishReason));
    if (o.includeUsage) send(null, { usage: o.usage(result) });
  } catch (err) {
    o.onDone();
    deps.metrics.unanswered(o.tenant);
    if (raw.destroyed) {
      // The client is gone (its leaving is what aborted the room): nothing to tell it.
    } else if (
      err instanceof RoomEndedError &&
      err.state === 'aborted' &&
      err.reason !== SHUTDOWN_REASON
    ) {
      // Aborted by an operator (or a drill) mid-stream: the text so far is all there is, and the
      // stream ends as vLLM's and SGLang's do, with finish_reason "abort" — not an error that
      // blames the client. Why, and the room to look at, in pdctl fields.
      if (!stopped && sent < text.length) send(piece(text.slice(sent), null));
      send(piece('', 'abort'), { pdctl_room: err.room, pdctl_abort_reason: err.reason });
    } else {
      const e = err instanceof RoomEndedError ? roomEnded(err) : toApiError(err);
      raw.write(`data: ${JSON.stringify(e.body())}\n\n`);
    }
  }
  if (!raw.destroyed) raw.end('data: [DONE]\n\n');
  return reply;
}
