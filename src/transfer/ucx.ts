/**
 * The network backend of the transfer core (docs/design.md §6): a room's pages to a pool on
 * another host, as two-sided UCX tagged messages — the receiver decides where the bytes land. A
 * node is one UCX context and worker per process, made without UCX's RMA feature, driven by its
 * own progress thread in the addon: no memory is registered for peers, no remote key exists, and
 * no peer names an address in this process (docs/security.md, "The KV network").
 *
 * The receiving side publishes its worker `address` (`describe`) and, for each room, posts a
 * `receive` into the pages it reserved for it; the sending side `post`s the room's source pages
 * to that address. Both derive the message's tag from the room id and the receiving pool's
 * epoch. A send completes once the receiver matched it, or ends `stalled` at its deadline; a
 * receive completes `ok` only when exactly the room's bytes arrived, and `cancel(room)` ends
 * either. A send carries the CRC32C of the source bytes in page order; a receive carries none (its
 * `checksum` is 0): the receiver computes its pages' own against the sender's committed one.
 *
 * Where UCX is absent (no libucx, or an addon built without its headers), `UcxNode.open()` throws
 * TRANSFER_BACKEND_UNAVAILABLE and `ucxBackend()` says why.
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { isValidId } from '../room/ids.ts';
import { checkFault, type Fault, type TransferResult } from './core.ts';
import { nativeCall, TransferError } from './errors.ts';
import { checkDeadline, InFlight } from './in-flight.ts';
import { type NativeUcxBackend, native, type UcxHandle } from './native.ts';
import type { PagePool } from './page-pool.ts';
import { nativePool } from './pool.ts';

/** What a peer needs to send a room's KV to this node's pool; every field crosses the bus as it is. */
export interface UcxPoolDescriptor {
  /** The receiving worker's address. */
  address: Buffer;
  pageBytes: number;
  pages: number;
  /** The pool's epoch: part of each room's tag, so a re-created pool takes no message meant for the old. */
  epoch: number;
}

export interface UcxPostRequest {
  room: string;
  src: PagePool;
  /** Source pages, in the order the receiver's pages take them. */
  pages: readonly number[];
  dst: UcxPoolDescriptor;
  deadlineMs: number;
}

export interface UcxReceiveRequest {
  room: string;
  pool: PagePool;
  /** The pages reserved for the room, in the order the message fills them. */
  pages: readonly number[];
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
export function checkPeer(peer: Pick<UcxPoolDescriptor, 'address'>): Promise<string | null> {
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
    child.stdin?.end(JSON.stringify({ address: peer.address.toString('base64') }));
  });
}

/** Whether this process can use UCX, and why not. */
export function ucxBackend(): NativeUcxBackend {
  return native().ucxBackend();
}

function bad(message: string): TransferError {
  return new TransferError('TRANSFER_BAD_ARGUMENT', message);
}

function checkRoom(room: string): void {
  if (!isValidId(room)) throw bad(`room must be a room id, got ${JSON.stringify(room)}`);
}

/** The pages as the addon takes them: integers in the pool, none twice, at least one. */
function pageList(pages: readonly number[], pool: PagePool): Uint32Array {
  if (pages.length === 0) throw bad('no pages');
  const seen = new Set<number>();
  for (const p of pages) {
    if (!Number.isInteger(p) || p < 0 || p >= pool.pages)
      throw bad(`page ${p} is not in pool ${pool.name} (${pool.pages} pages)`);
    if (seen.has(p)) throw bad(`page ${p} is named twice`);
    seen.add(p);
  }
  return Uint32Array.from(pages);
}

export class UcxNode {
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

  /** What a peer needs to send rooms' KV into `pool` through this node. */
  describe(pool: PagePool): UcxPoolDescriptor {
    if (pool.device !== null)
      throw bad(`pool ${pool.name} is on a CUDA device: UCX receives need a host pool`);
    return {
      address: this.address,
      pageBytes: pool.pageBytes,
      pages: pool.pages,
      epoch: pool.epoch,
    };
  }

  /** Sends the room's source pages to the peer; resolves once the peer matched the message. */
  post(request: UcxPostRequest): Promise<TransferResult> {
    let id: number;
    try {
      const { room, src, pages, dst, deadlineMs } = request;
      checkRoom(room);
      if (src.closed) throw new TransferError('TRANSFER_POOL_CLOSED', `pool ${src.name} is closed`);
      if (src.pageBytes !== dst.pageBytes)
        throw bad(
          `page sizes differ: ${src.name} has ${src.pageBytes} B pages, the peer ${dst.pageBytes} B`,
        );
      if (pages.length > dst.pages)
        throw bad(`${pages.length} pages do not fit the peer's pool of ${dst.pages}`);
      checkDeadline(deadlineMs);
      const list = pageList(pages, src);
      id = this.inFlight.id();
      nativeCall(() =>
        native().ucxPost(
          this.live(),
          id,
          room,
          dst.epoch,
          nativePool(src).handleForTransfer(),
          dst.address,
          list,
          deadlineMs,
        ),
      );
    } catch (err) {
      return Promise.reject(TransferError.from(err));
    }
    return this.inFlight.track(id, request.room);
  }

  /**
   * Posts a receive of the room's message into `pages` of `pool`: the only bytes a peer can
   * write into this process. Resolves `ok` when exactly the room's bytes arrived, `failed` on any
   * other message under its tag, `cancelled` by cancel(room); until then the pages are UCX's.
   */
  receive(request: UcxReceiveRequest): Promise<TransferResult> {
    let id: number;
    try {
      const { room, pool, pages } = request;
      checkRoom(room);
      if (pool.closed)
        throw new TransferError('TRANSFER_POOL_CLOSED', `pool ${pool.name} is closed`);
      const list = pageList(pages, pool);
      id = this.inFlight.id();
      nativeCall(() =>
        native().ucxReceive(
          this.live(),
          id,
          room,
          pool.epoch,
          nativePool(pool).handleForTransfer(),
          list,
        ),
      );
    } catch (err) {
      return Promise.reject(TransferError.from(err));
    }
    return this.inFlight.track(id, request.room);
  }

  /** Cancels the room's sends and receives; each completes `cancelled` once UCX let go of its pages. */
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
