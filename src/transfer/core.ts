/**
 * The transfer core as the engines see it (docs/design.md §6): post a room's (source page,
 * destination page) pairs, get one completion with the exact room tag, status, bytes, duration
 * and checksum. The copies run on the addon's worker threads. Engines depend on `TransferCore`,
 * so most of their tests can use a fake; `NativeTransferCore` is the real one.
 */
import { isValidId } from '../room/ids.ts';
import { TransferError } from './errors.ts';
import { checkDeadline, flatPairs, InFlight, type TransferResult, toResult } from './in-flight.ts';
import {
  type NativeTransferResult,
  type NativeTransferStats,
  native,
  type WorkersHandle,
} from './native.ts';
import type { PagePool } from './page-pool.ts';
import { nativePool } from './pool.ts';

export type { TransferResult, TransferStatus } from './in-flight.ts';

export interface TransferRequest {
  room: string;
  src: PagePool;
  dst: PagePool;
  /** (source page, destination page); runs contiguous on both sides are copied as one range. */
  pairs: ReadonlyArray<readonly [number, number]>;
  /** Past this the transfer ends as `stalled`. */
  deadlineMs: number;
  /** The destination epoch the pages were reserved under; default: the pool's current one. */
  epoch?: number;
}

export type FaultKind = 'stall' | 'delay' | 'corrupt' | 'fail';

export interface Fault {
  /** One room, or every transfer when absent. */
  room?: string;
  kind: FaultKind;
  /** For `delay`: how long before copying starts. */
  ms?: number;
}

export interface TransferStats extends NativeTransferStats {
  /** Transfers posted and not yet completed, as this process sees them. */
  inFlight: number;
}

export interface TransferCore {
  post(request: TransferRequest): Promise<TransferResult>;
  /** Cancels the room's queued and running transfers; they complete as `cancelled`. */
  cancel(room: string): number;
  /** Resolves once no transfer of the room is in flight: only then may its pages be reused. */
  release(room: string): Promise<void>;
  inject(fault: Fault): void;
  clearFaults(): void;
  stats(): TransferStats;
  /** Cancels what is in flight, waits for those completions, and stops the worker threads. */
  close(): Promise<void>;
}

const FAULT_KINDS: readonly FaultKind[] = ['stall', 'delay', 'corrupt', 'fail'];

function bad(message: string): TransferError {
  return new TransferError('TRANSFER_BAD_ARGUMENT', message);
}

/**
 * A fault spec `kind[:ms]` (`PDCTL_TRANSFER_FAULT`, or a drill's `inject_fault` command); empty or
 * `none` means no fault. `source` names where it came from in the error.
 */
export function parseFault(
  value: string | undefined,
  source = 'PDCTL_TRANSFER_FAULT',
): Fault | null {
  if (!value || value === 'none') return null;
  const [kind, ms] = value.split(':');
  if (!FAULT_KINDS.includes(kind as FaultKind) || (ms !== undefined && !/^\d+$/.test(ms))) {
    throw bad(
      `${source} must be none or one of ${FAULT_KINDS.join(', ')}, optionally :ms, got "${value}"`,
    );
  }
  return { kind: kind as FaultKind, ms: ms === undefined ? 0 : Number(ms) };
}

export class NativeTransferCore implements TransferCore {
  private readonly workers: WorkersHandle;
  private readonly inFlight = new InFlight();
  private closing: Promise<void> | null = null;

  /** `threads`: copy workers (default 2). */
  constructor(options: { threads?: number } = {}) {
    const threads = options.threads ?? 2;
    if (!Number.isInteger(threads) || threads < 1 || threads > 64) {
      throw bad(`threads must be an integer from 1 to 64, got ${threads}`);
    }
    this.workers = native().workersCreate(threads, (r) => this.inFlight.completed(r));
    const fault = parseFault(process.env.PDCTL_TRANSFER_FAULT);
    if (fault) this.inject(fault);
  }

  private live(): WorkersHandle {
    if (this.closing)
      throw new TransferError('TRANSFER_WORKERS_CLOSED', 'the transfer core is closed');
    return this.workers;
  }

  post(request: TransferRequest): Promise<TransferResult> {
    let id: number;
    let immediate: NativeTransferResult | null;
    try {
      const workers = this.live();
      const { room, src, dst, pairs, deadlineMs } = request;
      if (!isValidId(room)) throw bad(`room must be a room id, got ${JSON.stringify(room)}`);
      if (src.closed || dst.closed)
        throw new TransferError(
          'TRANSFER_POOL_CLOSED',
          `pool ${src.closed ? src.name : dst.name} is closed`,
        );
      if (src.pageBytes !== dst.pageBytes) {
        throw bad(
          `page sizes differ: ${src.name} has ${src.pageBytes} B pages, ${dst.name} ${dst.pageBytes} B`,
        );
      }
      const flat = flatPairs(pairs, src.pages, dst.pages);
      checkDeadline(deadlineMs);
      const epoch = request.epoch ?? dst.epoch;
      if (!Number.isSafeInteger(epoch) || epoch < 0)
        throw bad(`epoch must be a pool epoch, got ${epoch}`);
      id = this.inFlight.id();
      immediate = native().workersPost(
        workers,
        id,
        room,
        nativePool(src).handleForTransfer(),
        nativePool(dst).handleForTransfer(),
        flat,
        epoch,
        deadlineMs,
      );
    } catch (err) {
      return Promise.reject(TransferError.from(err));
    }
    if (immediate) return Promise.resolve(toResult(immediate));
    return this.inFlight.track(id, request.room);
  }

  cancel(room: string): number {
    if (typeof room !== 'string') throw bad('room must be a string');
    return native().workersCancel(this.live(), room);
  }

  release(room: string): Promise<void> {
    return this.inFlight.release(room);
  }

  inject(fault: Fault): void {
    checkFault(fault);
    native().workersInject(this.live(), fault.room ?? '', fault.kind, fault.ms ?? 0);
  }

  clearFaults(): void {
    native().workersClearFaults(this.live());
  }

  stats(): TransferStats {
    return { ...native().workersStats(this.live()), inFlight: this.inFlight.size };
  }

  close(): Promise<void> {
    if (this.closing) return this.closing;
    const inFlight = this.inFlight.releaseAll();
    // Cancels everything and joins the workers; their completions still arrive, as `cancelled`.
    native().workersClose(this.workers);
    this.closing = inFlight;
    return this.closing;
  }
}

/** A fault's kind, delay and room, checked before it reaches the addon. */
export function checkFault(fault: Fault): void {
  if (!FAULT_KINDS.includes(fault.kind))
    throw bad(`fault kind must be one of ${FAULT_KINDS.join(', ')}`);
  const ms = fault.ms ?? 0;
  if (!Number.isInteger(ms) || ms < 0 || ms > 3_600_000)
    throw bad('fault ms must be an integer from 0 to 3600000');
  if (fault.room !== undefined && !isValidId(fault.room)) throw bad(`fault room must be a room id`);
}
