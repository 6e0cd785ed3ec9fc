/** An engine session as the registry holds one, live and fresh at `now`, for tests of what reads it. */
import type { EngineMessage } from '../../src/bus/protocol.ts';
import type {
  EngineDelivery,
  EngineHealth,
  EngineIdentity,
  EngineLoad,
  EngineSession,
} from '../../src/control/engines/engine-session.ts';

/** Any field of any part of a session, given flat: each goes to the part that owns it. */
export type SessionOverrides = Partial<EngineIdentity & EngineDelivery & EngineHealth & EngineLoad>;

export function engineSession(
  engine: string,
  role: 'prefill' | 'decode',
  over: SessionOverrides = {},
  queues: Record<string, number> = {},
  now = Date.now(),
): EngineSession {
  const heartbeat: EngineMessage<'heartbeat'> = {
    ticks: { bus: 1, work: 1, transfer: 1 },
    queues,
    freePages: 10,
    rooms: 0,
    lastSeq: 0,
    state: 'ready',
  };
  const delivery: EngineDelivery = {
    live: true,
    session: 1,
    nextN: 1,
    broken: false,
    sentSeq: 0,
    lastDelivered: 0,
    joinedSeq: 0,
    buffer: [],
  };
  const health: EngineHealth = {
    lastSeen: now - 100,
    heartbeat,
    beats: 100,
    owedSeq: 0,
    behindSince: 0,
    transferMovedAt: now - 100,
    workMovedAt: now - 100,
    progressAt: now - 100,
    canaryFailures: 0,
    canaryFailingSince: 0,
    canaryReason: '',
  };
  const load: EngineLoad = { reservedPages: 0 };
  const identity: EngineIdentity = {
    engine,
    role,
    incarnation: `${engine}-a`,
    key: '',
    pid: 1,
    peer: Buffer.from(engine) as unknown as EngineSession['peer'],
    pool: `/pdctl-${engine}`,
    epoch: 1,
    pages: 10,
    pageBytes: 4096,
    kv: null,
    model: null,
    runtime: null,
    faultInjection: false,
    kvDevice: null,
    host: null,
    kvRemote: null,
    kvSend: 'auto',
    prefix: null,
    connectedAt: now - 60_000,
  };
  const parts: Array<Record<string, unknown>> = [identity, delivery, health, load].map(
    (p) => p as unknown as Record<string, unknown>,
  );
  for (const [k, v] of Object.entries(over)) {
    const part = parts.find((p) => k in p);
    if (!part) throw new Error(`engineSession: no field ${k}`);
    part[k] = v;
  }
  return { ...identity, delivery, health, load };
}
