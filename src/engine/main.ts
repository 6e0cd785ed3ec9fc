/**
 * The engine process's composition root (`pdctl engine`): it creates the KV pool and the transfer
 * core, connects the bus, wires the role, heartbeats, and on SIGTERM drains and exits. Nothing
 * else in src/engine/ opens sockets or exits the process.
 */

import { type KeyPair, signHello } from '../bus/admission.ts';
import { BusClient } from '../bus/client.ts';
import { type EngineMessage, PROTOCOL_VERSION } from '../bus/protocol.ts';
import { uuidv7 } from '../journal/ids.ts';
import type { Logger } from '../log.ts';
import type { EngineModel } from '../model/executor.ts';
import { isAlive } from '../pids.ts';
import { NativeTransferCore, type TransferCore } from '../transfer/core.ts';
import { TransferError } from '../transfer/errors.ts';
import { hostIdentity } from '../transfer/host.ts';
import { KvPool } from '../transfer/pool.ts';
import { UcxNode, ucxBackend } from '../transfer/ucx.ts';
import { DecodeEngine } from './decode.ts';
import type { EngineCore } from './engine.ts';
import type { EngineOptions } from './options.ts';
import { PrefillEngine } from './prefill.ts';

export interface RunningEngine {
  core: EngineCore;
  bus: BusClient;
  pool: KvPool;
  incarnation: string;
  /** Drains (at most drainTimeoutMs), then closes everything. Idempotent. */
  stop(reason: string): Promise<void>;
  stopped: Promise<void>;
}

/** An engine's bus credentials: its key pair, the control plane's public key, and whether CURVE is on. */
export interface EngineKeys extends KeyPair {
  serverKey: string;
  curve: boolean;
}

/**
 * The UCX node of `--kv-transport ucx` or `auto`; null for `shm`, and for `auto` where UCX is not
 * there (said once: then KV moves only between engines of this host). `ucx` without UCX is an
 * error that says why.
 */
function openUcx(opts: Readonly<EngineOptions>, log: Logger): UcxNode | null {
  if (opts.kvTransport === 'shm') return null;
  const backend = ucxBackend();
  if (!backend.available) {
    if (opts.kvTransport === 'ucx') {
      throw new TransferError(
        'TRANSFER_BACKEND_UNAVAILABLE',
        `--kv-transport ucx: UCX is not available here (${backend.reason}); use --kv-transport shm for engines on one host`,
      );
    }
    log.info(
      { reason: backend.reason },
      'no UCX here: KV moves only between engines on this host (shared memory)',
    );
    return null;
  }
  return UcxNode.open();
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

/** Starts the engine around `model` (the built-in one, or a llama.cpp model opened by the caller). */
export function startEngine(
  opts: Readonly<EngineOptions>,
  log: Logger,
  keys: EngineKeys,
  model: EngineModel,
): RunningEngine {
  const incarnation = uuidv7();
  // Before the pool: `--kv-transport ucx` without UCX leaves nothing behind in /dev/shm.
  const ucx = openUcx(opts, log);
  const pool = KvPool.create({
    name: opts.poolName,
    pages: opts.pages,
    pageBytes: opts.pageBytes,
    replace: true,
    ...(opts.kvDevice === null ? {} : { device: opts.kvDevice }),
  });
  let transfer: TransferCore | null = null;
  // A decode engine that may receive over UCX says so in its hello: where a room's KV is sent.
  const kvRemote =
    ucx && opts.role === 'decode' && pool.device === null ? ucx.describe(pool) : null;
  let core: EngineCore;
  const bus: BusClient = new BusClient(
    {
      endpoints: opts.control.split(','),
      engine: opts.id,
      incarnation,
      curve: keys.curve ? keys : undefined,
      log,
    },
    {
      hello: () => ({
        protocol: PROTOCOL_VERSION,
        engine: opts.id,
        role: opts.role,
        incarnation,
        pid: process.pid,
        pages: opts.pages,
        pageBytes: opts.pageBytes,
        kv: model.kv,
        ...(model.format === null ? {} : { model: model.format }),
        pool: pool.name,
        epoch: pool.epoch,
        lastSeq: core.lastSeq,
        rooms: core.heldRooms(),
        faultInjection: opts.allowFaultInjection,
        ...(pool.device === null ? {} : { kvDevice: pool.device }),
        host: hostIdentity(),
        kvSend: ucx === null ? 'shm' : opts.kvTransport,
        ...prefixHello(core),
        ...(kvRemote
          ? {
              kvRemote: { transport: 'ucx' as const, ...kvRemote },
            }
          : {}),
        auth: signHello({ engine: opts.id, role: opts.role, incarnation }, keys, keys.serverKey),
      }),
      welcome: (w) => {
        log.info(
          { replayFrom: w.replayFrom, replayEvents: w.replayEvents },
          'welcomed by the control plane',
        );
        core.onWelcome(w);
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
        pool.close();
        KvPool.unlink(pool.name);
        process.exit(1);
      },
    },
  );
  const ports = {
    append: bus.append.bind(bus),
    tokens: (msg: EngineMessage<'tokens'>) => bus.send('tokens', msg),
    resync: () => bus.sayHello(),
  };
  if (opts.role === 'prefill') {
    transfer = new NativeTransferCore({ threads: opts.transferThreads });
    core = new PrefillEngine(opts, ports, model, log, pool, transfer, ucx);
  } else {
    core = new DecodeEngine(opts, ports, model, log, pool, incarnation, kvRemote ? ucx : null);
  }

  let beats = 0;
  const heartbeat = setInterval(() => {
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
      const deadline = Date.now() + 2000;
      while (bus.unacked > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
      clearInterval(heartbeat);
      await bus.close();
      await transfer?.close();
      await ucx?.close();
      await model.close();
      pool.close();
      KvPool.unlink(pool.name);
      log.info({}, 'engine stopped');
      resolveStopped();
    })();
    return stopping;
  };
  core.onShutdown = () => void stop('shutdown command');
  // The ladder's in-place rung (docs/design.md §9): transfers stuck for a second are cancelled, faults
  // cleared, and the bus connection with its receive loop replaced; the process and model stay.
  // It arrives as SIGHUP from the supervisor (works even when the receive loop is dead) or as a
  // `reset_in_place` command.
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
  process.on('SIGHUP', () => resetInPlace('SIGHUP'));
  // Drill hook (`pdctl drill`, tests): SIGUSR2 freezes the bus receive loop, heartbeats go on.
  process.on('SIGUSR2', () => bus.freezeReceiveForDrill());
  // A spawned engine never outlives its parent (pdctl serve sets this for every engine it
  // starts): a survivor of a SIGKILLed control plane would fight the new one's engines. A parent
  // that died leaves us re-parented, or gone from the process table.
  const parent = Number(process.env.PDCTL_EXIT_WITH_PARENT ?? 0);
  if (parent > 0) {
    setInterval(() => {
      if (process.ppid !== parent || !isAlive(parent)) {
        log.warn({ parent }, 'parent process is gone; exiting');
        pool.close();
        KvPool.unlink(pool.name);
        process.exit(1);
      }
    }, 500).unref();
  }
  bus.start();
  log.info(
    {
      role: opts.role,
      control: opts.control,
      pool: pool.name,
      pages: opts.pages,
      pageBytes: opts.pageBytes,
      incarnation,
    },
    'engine started',
  );
  return { core, bus, pool, incarnation, stop, stopped };
}
