/** An engine session as the registry holds one, live and fresh at `now`, for tests of what reads it. */
import type { EngineMessage } from '../../src/bus/protocol.ts';
import type { EngineSession } from '../../src/control/registry.ts';

export function engineSession(
  engine: string,
  role: 'prefill' | 'decode',
  over: Partial<EngineSession> = {},
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
  return {
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
    tokensPerPage: null,
    reservedPages: 0,
    faultInjection: false,
    kvDevice: null,
    connectedAt: now - 60_000,
    lastSeen: now - 100,
    heartbeat,
    beats: 100,
    liveRooms: 0,
    live: true,
    owedSeq: 0,
    behindSince: 0,
    transferMovedAt: now - 100,
    workMovedAt: now - 100,
    progressAt: now - 100,
    canaryFailures: 0,
    canaryFailingSince: 0,
    canaryReason: '',
    session: 1,
    nextN: 1,
    broken: false,
    sentSeq: 0,
    lastDelivered: 0,
    buffer: [],
    ...over,
  };
}
