/**
 * The engine process's composition root (`pdctl engine`): it creates the KV pool in shared memory,
 * the native transfer core and UCX, hands them to wiring.ts (the role, the bus, heartbeats, the
 * drain), and answers signals. Nothing else in src/engine/ opens a pool or exits the process.
 */

import type { BusClient } from '../bus/client.ts';
import type { Logger } from '../log.ts';
import type { EngineModel } from '../model/executor.ts';
import { isAlive } from '../pids.ts';
import { uuidv7 } from '../room/ids.ts';
import { NativeTransferCore } from '../transfer/core.ts';
import { TransferError } from '../transfer/errors.ts';
import { hostIdentity } from '../transfer/host.ts';
import { KvPool } from '../transfer/pool.ts';
import { UcxNode, ucxBackend } from '../transfer/ucx.ts';
import type { EngineCore } from './engine.ts';
import type { EngineOptions } from './options.ts';
import { type EngineKeys, wireEngine } from './wiring.ts';

export interface RunningEngine {
  core: EngineCore;
  bus: BusClient;
  pool: KvPool;
  incarnation: string;
  /** Drains (at most drainTimeoutMs), then closes everything. Idempotent. */
  stop(reason: string): Promise<void>;
  stopped: Promise<void>;
}

export type { EngineKeys } from './wiring.ts';

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
  /** The pool leaves /dev/shm with the process, however it ends. */
  const dropPool = () => {
    pool.close();
    KvPool.unlink(pool.name);
  };
  const transfer =
    opts.role === 'prefill' ? new NativeTransferCore({ threads: opts.transferThreads }) : null;
  // A decode engine that may receive over UCX says so in its hello: where a room's KV is sent.
  const kvRemote =
    ucx && opts.role === 'decode' && pool.device === null ? ucx.describe(pool) : null;
  const engine = wireEngine({
    opts,
    log,
    keys,
    model,
    incarnation,
    pool,
    transfer,
    ucx,
    kvRemote,
    pid: process.pid,
    host: hostIdentity(),
    kvSend: ucx === null ? 'shm' : opts.kvTransport,
    refused: () => {
      dropPool();
      process.exit(1);
    },
    release: async () => {
      await transfer?.close();
      await ucx?.close();
      await model.close();
      dropPool();
    },
  });
  // The in-place rung arrives as SIGHUP from the supervisor (works even when the receive loop is
  // dead) or as a `reset_in_place` command.
  process.on('SIGHUP', () => engine.resetInPlace('SIGHUP'));
  // Drill hook (`pdctl drill`, tests): SIGUSR2 freezes the bus receive loop, heartbeats go on.
  process.on('SIGUSR2', () => engine.bus.freezeReceiveForDrill());
  // A spawned engine never outlives its parent (pdctl serve sets this for every engine it
  // starts): a survivor of a SIGKILLed control plane would fight the new one's engines. A parent
  // that died leaves us re-parented, or gone from the process table.
  const parent = Number(process.env.PDCTL_EXIT_WITH_PARENT ?? 0);
  if (parent > 0) {
    setInterval(() => {
      if (process.ppid !== parent || !isAlive(parent)) {
        log.warn({ parent }, 'parent process is gone; exiting');
        dropPool();
        process.exit(1);
      }
    }, opts.parentCheckMs).unref();
  }
  log.info(
    {
      role: opts.role,
      control: opts.control,
      pool: pool.name,
      pages: opts.pages,
      pageBytes: opts.pageBytes,
      incarnation,
      // What llama.cpp gave the model (context, threads, GPU): a silent CPU fallback shows here.
      ...(model.runtime ? { runtime: model.runtime } : {}),
    },
    'engine started',
  );
  const { core, bus, stop, stopped } = engine;
  return { core, bus, pool, incarnation, stop, stopped };
}
