/**
 * The hello handshake's checks, in the order they run: an engine is registered only when it speaks
 * this protocol, proves it holds an allowed key, is not a fenced incarnation, keeps its role,
 * runs this control plane's model, names a KV pool and UCX descriptor no other engine holds, and
 * is within its quota of new incarnations. Each check is a
 * function of the hello and what the control plane knows; the first that fails says why, as the
 * nack the engine is sent (engine-link.ts sends it, registers the session, and replays).
 */
import type { Admission } from '../../bus/admission.ts';
import type { BusErrorCode } from '../../bus/errors.ts';
import { type EngineMessage, PROTOCOL_VERSION } from '../../bus/protocol.ts';
import type { PeerId } from '../../bus/server.ts';
import type { EngineSession } from './engine-session.ts';

/** New incarnations one engine id may register in a burst (then one per `REGISTRATION_EVERY_MS`). */
export const REGISTRATIONS_BURST = 5;
/**
 * A real engine is restarted a few times an hour at worst (the ladder caps restarts at 3 in 10
 * minutes); a holder of its key that says hello as a new process over and over would otherwise add
 * an `engine.registered` and a replay of the engine's history each time.
 */
export const REGISTRATION_EVERY_MS = 10_000;

/** Why a hello is refused: the nack, and what is counted or logged beside it. */
export interface HelloRefusal {
  check: string;
  code: BusErrorCode;
  message: string;
  retryable: boolean;
  /** Counted as a dropped frame of this reason. */
  drop?: 'unauthorized' | 'rate_limited';
  /** Logged, at this level, with these fields. */
  log?: { level: 'warn' | 'error'; msg: string; fields: Record<string, unknown> };
  /** Journaled once per engine per minute as a throttle. */
  throttle?: { what: string; effect: string };
}

/** What the checks read. */
export interface HelloContext {
  admission: Admission;
  /** The engine's registered session, if any (a reconnect, or an earlier incarnation). */
  prev: EngineSession | undefined;
  /** The model the engines must run (`ModelInfo.format`); null: the built-in model. */
  modelFormat: string | null;
  /** Why this incarnation was fenced; undefined when it was not. */
  fenced(engine: string, incarnation: string): string | undefined;
  /** Whether the engine may register one more new incarnation now (takes from its quota). */
  mayRegister(engine: string): boolean;
  /** The other engines registered now (another engine id): their pools and descriptors are theirs. */
  others(
    engine: string,
  ): readonly Pick<EngineSession, 'engine' | 'incarnation' | 'pool' | 'kvRemote'>[];
  /** The control plane's time, which the hello's proof must be near. Default: the process's. */
  now?: number;
}

type Hello = EngineMessage<'hello'>;

export type HelloVerdict =
  | { ok: true; key: string; fresh: boolean }
  | { ok: false; refusal: HelloRefusal };

/** Runs the checks in order: the first refusal, or the admitted key and whether this is a new incarnation. */
export function checkHello(msg: Hello, ctx: HelloContext): HelloVerdict {
  const refused = speaksThisProtocol(msg);
  if (refused) return { ok: false, refusal: refused };
  const proof = ctx.admission.verify(msg, msg.auth, ctx.prev?.key ?? null, ctx.now);
  if (!proof.ok) {
    return {
      ok: false,
      refusal: {
        check: 'proves its key',
        code: 'BUS_UNAUTHORIZED',
        message: proof.reason,
        retryable: false,
        drop: 'unauthorized',
      },
    };
  }
  // Told only to a sender that proved it holds the engine's key.
  const fresh = !ctx.prev || ctx.prev.incarnation !== msg.incarnation;
  for (const check of [notFenced, keepsItsRole, runsThisModel, ownsItsKv]) {
    const r = check(msg, ctx);
    if (r) return { ok: false, refusal: r };
  }
  if (fresh) {
    const r = withinRegistrationQuota(msg, ctx);
    if (r) return { ok: false, refusal: r };
  }
  return { ok: true, key: proof.key, fresh };
}

function speaksThisProtocol(msg: Hello): HelloRefusal | null {
  if (msg.protocol === PROTOCOL_VERSION) return null;
  return {
    check: 'speaks this protocol',
    code: 'BUS_PROTOCOL_MISMATCH',
    message: `this control plane speaks protocol ${PROTOCOL_VERSION}, the engine ${msg.protocol}`,
    retryable: false,
  };
}

function notFenced(msg: Hello, ctx: HelloContext): HelloRefusal | null {
  const why = ctx.fenced(msg.engine, msg.incarnation);
  if (why === undefined) return null;
  return { check: 'not fenced', code: 'BUS_FENCED', message: why, retryable: false };
}

function keepsItsRole(msg: Hello, ctx: HelloContext): HelloRefusal | null {
  const was = ctx.prev?.role;
  if (was === undefined || was === msg.role) return null;
  return {
    check: 'keeps its role',
    code: 'BUS_INVALID_EVENT',
    message: `engine ${msg.engine} is registered as ${was}; pick another --id`,
    retryable: false,
    log: {
      level: 'error',
      msg: 'engine id reused with another role; refused',
      fields: { engine: msg.engine, was, now: msg.role },
    },
  };
}

/**
 * Both ways: a control plane of the built-in model cannot drive llama.cpp engines either (they
 * take token ids it does not send).
 */
function runsThisModel(msg: Hello, ctx: HelloContext): HelloRefusal | null {
  const format = ctx.modelFormat;
  if ((msg.model ?? null) === format) return null;
  return {
    check: 'runs this model',
    code: 'BUS_MODEL_MISMATCH',
    message: `this control plane serves ${format ?? 'the built-in model'}; the engine runs ${msg.model ?? 'the built-in model'}: start both with the same --model and --sequences`,
    retryable: false,
    log: {
      level: 'warn',
      msg: 'engine of another model refused',
      fields: { engine: msg.engine, model: msg.model, serving: format },
    },
  };
}

/**
 * A pool and its UCX descriptor belong to one engine incarnation: a hello naming a pool or a
 * worker address another registered engine holds would have the control plane reserve pages of
 * one pool for two engines' rooms (docs/security.md, "An engine that holds a valid key").
 */
function ownsItsKv(msg: Hello, ctx: HelloContext): HelloRefusal | null {
  const address = msg.kvRemote ? Buffer.from(msg.kvRemote.address) : null;
  for (const o of ctx.others(msg.engine)) {
    const what =
      o.pool === msg.pool
        ? `KV pool ${msg.pool}`
        : address && o.kvRemote && address.equals(Buffer.from(o.kvRemote.address))
          ? 'UCX worker address'
          : null;
    if (!what) continue;
    return {
      check: 'owns its KV pool',
      code: 'BUS_IDENTITY_CONFLICT',
      message: `the ${what} this engine names is engine ${o.engine}'s (incarnation ${o.incarnation}); each pool and UCX descriptor belongs to one engine: start it with a pool of its own`,
      retryable: false,
      log: {
        level: 'error',
        msg: "engine named another engine's KV pool or UCX descriptor; refused",
        fields: { engine: msg.engine, pool: msg.pool, holder: o.engine, what },
      },
    };
  }
  return null;
}

function withinRegistrationQuota(msg: Hello, ctx: HelloContext): HelloRefusal | null {
  if (ctx.mayRegister(msg.engine)) return null;
  return {
    check: 'within its registration quota',
    code: 'BUS_RATE_LIMITED',
    message: `engine ${msg.engine} registered more than ${REGISTRATIONS_BURST} new incarnations in a short time; this hello is refused, try again in ${REGISTRATION_EVERY_MS / 1000} s`,
    retryable: true,
    drop: 'rate_limited',
    throttle: {
      what: `more than ${REGISTRATIONS_BURST} new incarnations at once, or one per ${REGISTRATION_EVERY_MS / 1000} s`,
      effect:
        'hellos of new incarnations over the quota are refused (BUS_RATE_LIMITED); the registered one keeps serving',
    },
  };
}

/**
 * The session an admitted hello opens. A reconnect of the same process (same incarnation) keeps
 * its heartbeat history and the pages promised to its rooms; a new incarnation starts empty.
 */
export function openSession(
  msg: Hello,
  peer: PeerId,
  key: string,
  prev: EngineSession | undefined,
  fresh: boolean,
  sessionNo: number,
  now: number,
): EngineSession {
  return {
    engine: msg.engine,
    role: msg.role,
    incarnation: msg.incarnation,
    key,
    pid: msg.pid,
    peer,
    pool: msg.pool,
    epoch: msg.epoch,
    pages: msg.pages,
    pageBytes: msg.pageBytes,
    kv: msg.kv ?? null,
    model: msg.model ?? null,
    runtime: msg.runtime ?? null,
    faultInjection: msg.faultInjection === true,
    kvDevice: msg.kvDevice ?? null,
    host: msg.host ?? null,
    kvRemote: msg.kvRemote ?? null,
    kvSend: msg.kvSend ?? 'auto',
    prefix: msg.prefix ?? null,
    connectedAt: now,
    delivery: {
      live: false,
      session: sessionNo,
      nextN: 1,
      broken: false,
      sentSeq: 0,
      lastDelivered: msg.lastSeq,
      buffer: [],
      joinedSeq: fresh ? null : (prev?.delivery.joinedSeq ?? null),
    },
    health: {
      lastSeen: now,
      // The same process keeps its counters: its next heartbeat is compared with its last one.
      heartbeat: fresh ? null : (prev?.health.heartbeat ?? null),
      beats: 0,
      owedSeq: 0,
      behindSince: 0,
      transferMovedAt: now,
      // The same process (an in-place reset) keeps its loops' history: one that was frozen before
      // the new connection is still frozen until its tick moves.
      workMovedAt: fresh ? now : (prev?.health.workMovedAt ?? now),
      progressAt: fresh ? now : (prev?.health.progressAt ?? now),
      canaryFailures: 0,
      canaryFailingSince: 0,
      canaryReason: '',
    },
    load: {
      reservedPages: fresh ? 0 : (prev?.load.reservedPages ?? 0),
    },
  };
}
