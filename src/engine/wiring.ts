/**
 * An engine on its ports: the role's core (prefill.ts, decode.ts) joined to the bus client, its
 * hello, its heartbeats and its drain. What it is given — the pool, the transfer core, UCX, the
 * clock, the bus transport — is the caller's: `pdctl engine` (main.ts) gives it shared memory,
 * the native transfer core and ZeroMQ; the simulator (src/sim/) gives it memory, an in-memory
 * transfer core and network, and a virtual clock. Nothing here opens a pool or exits a process.
 */
import { type KeyPair, signHello } from '../bus/admission.ts';
import { BusClient } from '../bus/client.ts';
import {
  type ControlMessage,
  type EngineMessage,
  type KvSend,
  PROTOCOL_VERSION,
} from '../bus/protocol.ts';
import type { BusTransport } from '../bus/transport.ts';
import type { Logger } from '../log.ts';
import type { EngineModel } from '../model/executor.ts';
import { type Clock, systemClock } from '../ports/clock.ts';
import { type Ids, systemIds } from '../ports/ids.ts';
import type { TransferCore } from '../transfer/core.ts';
import type { PagePool, PoolOpener } from '../transfer/page-pool.ts';
import type { UcxNode, UcxPoolDescriptor } from '../transfer/ucx.ts';
import { DecodeEngine } from './decode.ts';
import type { EngineCore } from './engine.ts';
import type { EngineOptions } from './options.ts';
import { PrefillEngine } from './prefill.ts';

type AppendEvent = EngineMessage<'append'>['event'];
type Says = (event: AppendEvent) => AppendEvent;

/** An engine's bus credentials: its key pair, the control plane's public key, and whether CURVE is on. */
export interface EngineKeys extends KeyPair {
  serverKey: string;
  curve: boolean;
}

export interface EngineWiring {
  opts: Readonly<EngineOptions>;
  log: Logger;
  keys: EngineKeys;
  model: EngineModel;
  incarnation: string;
  pool: PagePool;
  /** Prefill: moves pages into decode pools on this host. */
  transfer: TransferCore | null;
  /** Sends (prefill) or receives (decode, with `kvRemote`) KV across hosts; null: not used. */
  ucx: UcxNode | null;
  /** Decode: where peers send a room's KV over UCX, announced in the hello. */
  kvRemote: UcxPoolDescriptor | null;
  /** What the hello says of the process and its host. */
  pid: number;
  host: string;
  /** Which transport it sends with (hello `kvSend`). */
  kvSend: KvSend;
  openPool?: PoolOpener;
  clock?: Clock;
  ids?: Ids;
  transport?: BusTransport;
  /** The secret part of each bus connection's routing id. Default: 96 random bits. */
  nonce?: () => string;
  /**
   * What the engine appends, as it goes onto the bus: the simulator's lying engine rewrites it
   * here (sim/faults.ts `lie`). Absent: as the engine wrote it.
   */
  says?: (event: AppendEvent) => AppendEvent;
  /** The control plane refused this engine for good: the process must go (main.ts exits). */
  refused(nack: ControlMessage<'nack'>): void;
  /** Releases what the caller gave (pool, transfer core, UCX, model) once the engine stopped. */
  release(): Promise<void>;
}

export interface WiredEngine {
  core: EngineCore;
  bus: BusClient;
  /** Drains (at most drainTimeoutMs), then closes everything. Idempotent. */
  stop(reason: string): Promise<void>;
  stopped: Promise<void>;
  /** The ladder's in-place rung: transfers stuck for a second cancelled, the bus connection replaced. */
  resetInPlace(reason: string): void;
}

/** A prefill engine's prefix cache as its hello announces it (protocol.ts `hello.prefix`). */
function prefixHello(core: EngineCore): {
  prefix?: { blockTokens: number; capacityBlocks: number };
} {
  const p = core instanceof PrefillEngine ? core.prefixes?.announce() : undefined;
  return p ? { prefix: { blockTokens: p.blockTokens, capacityBlocks: p.capacityBlocks } } : {};
}

/** The blocks a prefill engine's prefix cache holds, for its heartbeat. */
function cachedBlocks(core: EngineCore): { cachedBlocks?: number } {
  const p = core instanceof PrefillEngine ? core.prefixes?.announce() : undefined;
  return p ? { cachedBlocks: p.blocks } : {};
}

/** Builds the role's core on `w`, connects its bus and starts its heartbeats. */
export function wireEngine(w: EngineWiring): WiredEngine {
  const { opts, log, keys, model, incarnation, pool } = w;
  const clock = w.clock ?? systemClock;
  const ids = w.ids ?? systemIds;
  let core: EngineCore;
  const bus: BusClient = new BusClient(
    {
      endpoints: opts.control.split(','),
      engine: opts.id,
      incarnation,
      curve: keys.curve ? keys : undefined,
      log,
      clock,
      ...(w.transport ? { transport: w.transport } : {}),
      ...(w.nonce ? { nonce: w.nonce } : {}),
    },
    {
      hello: () => ({
        protocol: PROTOCOL_VERSION,
        engine: opts.id,
        role: opts.role,
        incarnation,
        pid: w.pid,
        pages: opts.pages,
        pageBytes: opts.pageBytes,
        kv: model.kv,
        ...(model.format === null ? {} : { model: model.format }),
        ...(model.runtime ? { runtime: model.runtime } : {}),
        pool: pool.name,
        epoch: pool.epoch,
        lastSeq: core.lastSeq,
        rooms: core.heldRooms(),
        faultInjection: opts.allowFaultInjection,
        ...(pool.device === null ? {} : { kvDevice: pool.device }),
        host: w.host,
        kvSend: w.kvSend,
        ...prefixHello(core),
        ...(w.kvRemote ? { kvRemote: { transport: 'ucx' as const, ...w.kvRemote } } : {}),
        auth: signHello(
          { engine: opts.id, role: opts.role, incarnation },
          keys,
          keys.serverKey,
          clock.now(),
        ),
      }),
      welcome: (m) => {
        log.info(
          { replayFrom: m.replayFrom, replayEvents: m.replayEvents },
          'welcomed by the control plane',
        );
        core.onWelcome(m);
      },
      event: (m) => core.onEvent(m),
      command: (c) => core.onCommand(c),
      kvArrived: (m) => core.onKvArrived(m),
      refused: (nack) => {
        // Nothing this process holds can be reconciled (another protocol, or a journal that
        // ends before our history): exit, so that a fresh process — the supervisor's, systemd's,
        // the orchestrator's — rejoins with nothing to reconcile.
        log.error(
          { code: nack.code, reason: nack.message },
          'refused by the control plane; exiting',
        );
        w.refused(nack);
      },
    },
  );
  const ports = {
    append: w.says
      ? (eventId: string, event: AppendEvent) => bus.append(eventId, (w.says as Says)(event))
      : bus.append.bind(bus),
    tokens: (msg: EngineMessage<'tokens'>) => bus.send('tokens', msg),
    resync: () => bus.sayHello(),
  };
  const parts = { opts, ports, model, log, pool, clock, ids };
  core =
    opts.role === 'prefill'
      ? new PrefillEngine({
          ...parts,
          core: w.transfer as TransferCore,
          ucx: w.ucx,
          host: w.host,
          ...(w.openPool ? { openPool: w.openPool } : {}),
        })
      : new DecodeEngine({ ...parts, incarnation, ucx: w.kvRemote ? w.ucx : null });

  let beats = 0;
  const heartbeat = clock.setInterval(() => {
    beats++;
    bus.send('heartbeat', {
      ticks: {
        bus: bus.loop.ticks,
        work: core.workTicks,
        transfer: core.transferTicks,
        heartbeat: beats,
        resets: bus.resets,
      },
      queues: { ...core.queueDepths(), outbox: bus.outboxDepth, unacked: bus.unacked },
      freePages: core.freePages(),
      ...cachedBlocks(core),
      rooms: core.rooms.size,
      lastSeq: core.lastSeq,
      state: core.state === 'stopped' ? 'draining' : core.state,
    });
  }, opts.heartbeatMs);

  let resolveStopped: () => void = () => {};
  const stopped = new Promise<void>((r) => (resolveStopped = r));
  let stopping: Promise<void> | null = null;
  const stop = (reason: string): Promise<void> => {
    if (stopping) return stopping;
    stopping = (async () => {
      log.info({ reason, rooms: core.heldRooms().length }, 'engine draining');
      const drained = await core.drain(opts.drainTimeoutMs);
      if (!drained)
        log.warn({ rooms: core.heldRooms() }, 'drain timed out; exiting with rooms held');
      // Let the last releases reach the control plane before the socket goes.
      const deadline = clock.now() + 2000;
      while (bus.unacked > 0 && clock.now() < deadline)
        await new Promise<void>((r) => clock.setTimeout(r, 20));
      clock.clear(heartbeat);
      await bus.close();
      await w.release();
      log.info({}, 'engine stopped');
      resolveStopped();
    })();
    return stopping;
  };
  core.onShutdown = () => void stop('shutdown command');
  // The ladder's in-place rung (docs/design.md §9): transfers stuck for a second are cancelled, faults
  // cleared, and the bus connection with its receive loop replaced; the process and model stay.
  let resetting = false;
  const resetInPlace = (reason: string) => {
    if (resetting || stopping) return;
    resetting = true;
    const cancelled = core.resetTransfer(1000);
    log.warn(
      { reason, cancelledTransfers: cancelled },
      'resetting the bus and transfer endpoint in place',
    );
    void bus.reset(reason).finally(() => {
      resetting = false;
    });
  };
  core.onResetInPlace = resetInPlace;
  bus.start();
  return { core, bus, stop, stopped, resetInPlace };
}
