/**
 * The network backend of the transfer core (docs/design.md §6): one-sided UCX puts of a room's
 * pages into a pool on another host. A node is one UCX context and worker per process, driven by
 * its own progress thread in the addon. The receiving side registers its pool once
 * (`register`) and publishes what a peer needs — its worker `address`, the pool's remote key and
 * the address of page 0 — and the sending side `post`s (source page, destination page) pairs
 * against that description. A transfer completes only after a flush: the bytes are at the
 * destination. Each has a deadline that ends it `stalled`, `cancel(room)`, and the CRC32C of the
 * source bytes in pair order, which the receiving side compares with its own pages.
 *
 * Where UCX is absent (no libucx, or an addon built without its headers), `UcxNode.open()` throws
 * TRANSFER_BACKEND_UNAVAILABLE and `ucxBackend()` says why.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { isValidId } from '../journal/events.ts';
import { checkFault, type Fault, type TransferResult } from './core.ts';
import { nativeCall, TransferError } from './errors.ts';
import { checkDeadline, flatPairs, InFlight } from './in-flight.ts';
import { type NativeUcxBackend, native, type UcxHandle } from './native.ts';
import type { KvPool } from './pool.ts';

/** What a peer needs to put into a registered pool; every field crosses the bus as it is. */
export interface UcxPoolDescriptor {
  /** The peer worker's address. */
  address: Buffer;
  /** The pool's packed remote key. */
  rkey: Buffer;
  /** The address of page 0 in the peer's process. */
  base: number;
  pageBytes: number;
  pages: number;
  /** The pool's epoch when it was registered: a re-created pool is registered anew. */
  epoch: number;
}

export interface UcxPostRequest {
  room: string;
  src: KvPool;
  dst: UcxPoolDescriptor;
  pairs: ReadonlyArray<readonly [number, number]>;
  deadlineMs: number;
}

// From source (tests, `npm run`), the check runs through tsx like the rest; from dist/, as is.
const FROM_SOURCE = import.meta.url.endsWith('.ts');
const CHECK_SCRIPT = fileURLToPath(
  new URL(`./ucx-check${FROM_SOURCE ? '.ts' : '.js'}`, import.meta.url),
);
const CHECK_TIMEOUT_MS = 10_000;

/** ucx-check's exit code for a descriptor UCX refused without aborting. */
export const REFUSED_EXIT = 3;

/**
 * Whether a peer's descriptor is one UCX can use, checked in a throwaway process: UCX aborts a
 * process that unpacks a malformed worker address, and the descriptor came from another engine
 * (a buggy or compromised one must not be able to kill this one). Null when it is good; else why.
 */
export function checkPeer(
  peer: Pick<UcxPoolDescriptor, 'address' | 'rkey'>,
): Promise<string | null> {
  return new Promise((resolve) => {
    const args = FROM_SOURCE ? ['--import', 'tsx', CHECK_SCRIPT] : [CHECK_SCRIPT];
    const child = spawn(process.execPath, args, {
      stdio: ['pipe', 'pipe', 'pipe'],
      timeout: CHECK_TIMEOUT_MS,
    });
    let out = '';
    let err = '';
    child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr?.on('data', (d: Buffer) => (err += d.toString()));
    child.once('error', (e) => resolve(`the check could not run: ${e.message}`));
    child.once('close', (code, signal) => {
      if (code === 0) resolve(null);
      else if (code === REFUSED_EXIT) resolve(out.slice(0, 500));
      else if (signal === 'SIGTERM') resolve(`UCX did not answer within ${CHECK_TIMEOUT_MS} ms`);
      else if (signal !== null || /UCX +FATAL|backtrace/.test(err))
        resolve(
          `UCX aborted on it (${signal ?? `exit ${code}`}): a malformed worker address or key`,
        );
      else
        resolve(`the check failed (exit ${code}): ${err.trim().split('\n').at(-1)?.slice(0, 300)}`);
    });
    child.stdin?.end(
      JSON.stringify({
        address: peer.address.toString('base64'),
        rkey: peer.rkey.toString('base64'),
      }),
    );
  });
}

/** Whether this process can use UCX, and why not. */
export function ucxBackend(): NativeUcxBackend {
  return native().ucxBackend();
}

function bad(message: string): TransferError {
  return new TransferError('TRANSFER_BAD_ARGUMENT', message);
}

export class UcxNode {
  private readonly registered = new Map<KvPool, number>();
  private closing: Promise<void> | null = null;

  private constructor(
    private readonly node: UcxHandle,
    private readonly inFlight: InFlight,
  ) {}

  /** A node of this process; TRANSFER_BACKEND_UNAVAILABLE (saying why) where UCX is not usable. */
  static open(): UcxNode {
    const inFlight = new InFlight();
    const node = nativeCall(() => native().ucxCreate((r) => inFlight.completed(r)));
    return new UcxNode(node, inFlight);
  }

  /** This node's worker address, for peers. */
  get address(): Buffer {
    return native().ucxAddress(this.live());
  }

  /** Registers a host pool for puts from peers; the descriptor is what a peer posts against. */
  register(pool: KvPool): UcxPoolDescriptor {
    if (pool.device !== null)
      throw bad(`pool ${pool.name} is on a CUDA device: UCX puts need a host pool`);
    const r = nativeCall(() => native().ucxRegister(this.live(), pool.handleForTransfer()));
    this.registered.set(pool, r.id);
    return {
      address: this.address,
      rkey: r.rkey,
      base: r.base,
      pageBytes: pool.pageBytes,
      pages: pool.pages,
      epoch: pool.epoch,
    };
  }

  unregister(pool: KvPool): void {
    const id = this.registered.get(pool);
    if (id === undefined) return;
    this.registered.delete(pool);
    native().ucxUnregister(this.live(), id);
  }

  post(request: UcxPostRequest): Promise<TransferResult> {
    let id: number;
    try {
      const { room, src, dst, pairs, deadlineMs } = request;
      if (!isValidId(room)) throw bad(`room must be a room id, got ${JSON.stringify(room)}`);
      if (src.closed) throw new TransferError('TRANSFER_POOL_CLOSED', `pool ${src.name} is closed`);
      if (src.pageBytes !== dst.pageBytes)
        throw bad(
          `page sizes differ: ${src.name} has ${src.pageBytes} B pages, the peer ${dst.pageBytes} B`,
        );
      const flat = flatPairs(pairs, src.pages, dst.pages);
      checkDeadline(deadlineMs);
      id = this.inFlight.id();
      nativeCall(() =>
        native().ucxPost(
          this.live(),
          id,
          room,
          src.handleForTransfer(),
          dst.address,
          dst.rkey,
          dst.base,
          dst.pageBytes,
          dst.pages,
          flat,
          deadlineMs,
        ),
      );
    } catch (err) {
      return Promise.reject(TransferError.from(err));
    }
    return this.inFlight.track(id, request.room);
  }

  /** Cancels the room's transfers; puts already posted finish first, then it completes `cancelled`. */
  cancel(room: string): number {
    return native().ucxCancel(this.live(), room);
  }

  /** Resolves once no transfer of the room is in flight: only then may its pages be reused. */
  release(room: string): Promise<void> {
    return this.inFlight.release(room);
  }

  inject(fault: Fault): void {
    checkFault(fault);
    native().ucxInject(this.live(), fault.room ?? '', fault.kind, fault.ms ?? 0);
  }

  clearFaults(): void {
    native().ucxClearFaults(this.live());
  }

  /** Ends what is in flight (cancelled), waits for those completions, and stops the thread. */
  close(): Promise<void> {
    if (this.closing) return this.closing;
    const inFlight = this.inFlight.releaseAll();
    native().ucxClose(this.node);
    this.closing = inFlight;
    return this.closing;
  }

  private live(): UcxHandle {
    if (this.closing) throw new TransferError('TRANSFER_WORKERS_CLOSED', 'the UCX node is closed');
    return this.node;
  }
}
