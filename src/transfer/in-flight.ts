/**
 * What every backend of the transfer core keeps on the JS side: the transfers it posted, by id and
 * by room, so that each completion resolves its own promise and `release(room)` resolves once the
 * room has nothing in flight (only then may its pages be reused); and the checks of a request's
 * page pairs, made before anything reaches the addon.
 */
import { TransferError } from './errors.ts';
import type { NativeTransferResult } from './native.ts';

export type TransferStatus = NativeTransferResult['status'];

/** One transfer's completion, whichever backend moved the bytes. */
export interface TransferResult {
  room: string;
  status: TransferStatus;
  bytes: number;
  micros: number;
  /** CRC32C of the source bytes in pair order, 8 hex digits; compare with dst.checksumPages(). */
  checksum: string;
  error: string | null;
}

export class InFlight {
  private nextId = 1;
  private readonly pending = new Map<number, (r: NativeTransferResult) => void>();
  private readonly byRoom = new Map<string, Set<number>>();
  private readonly releaseWaiters = new Map<string, Array<() => void>>();

  /** A new transfer id, to post under. */
  id(): number {
    return this.nextId++;
  }

  /** The promise of a posted transfer; settled by `completed`. */
  track(id: number, room: string): Promise<TransferResult> {
    const ids = this.byRoom.get(room) ?? new Set<number>();
    ids.add(id);
    this.byRoom.set(room, ids);
    return new Promise((resolve) => this.pending.set(id, (r) => resolve(toResult(r))));
  }

  /** A completion from the addon: the transfer's own promise first, release() of its room after. */
  completed(r: NativeTransferResult): void {
    const resolve = this.pending.get(r.id);
    this.pending.delete(r.id);
    resolve?.(r);
    const ids = this.byRoom.get(r.room);
    ids?.delete(r.id);
    if (ids && ids.size === 0) {
      this.byRoom.delete(r.room);
      for (const w of this.releaseWaiters.get(r.room) ?? []) w();
      this.releaseWaiters.delete(r.room);
    }
  }

  release(room: string): Promise<void> {
    if (!this.byRoom.has(room)) return Promise.resolve();
    return new Promise((resolve) => {
      const waiters = this.releaseWaiters.get(room) ?? [];
      waiters.push(resolve);
      this.releaseWaiters.set(room, waiters);
    });
  }

  /** Resolves once every room has nothing in flight. */
  releaseAll(): Promise<void> {
    return Promise.all([...this.byRoom.keys()].map((room) => this.release(room))).then(() => {});
  }

  get size(): number {
    return this.pending.size;
  }
}

/**
 * `pairs` as the addon takes them, `[src, dst, src, dst, …]`, after checking each page against
 * the pool sizes and that no destination page is written twice.
 */
export function flatPairs(
  pairs: ReadonlyArray<readonly [number, number]>,
  srcPages: number,
  dstPages: number,
): Uint32Array {
  if (!Array.isArray(pairs) || pairs.length === 0)
    throw bad('pairs must be a non-empty array of [srcPage, dstPage]');
  const flat = new Uint32Array(pairs.length * 2);
  const seen = new Set<number>();
  pairs.forEach((pair, i) => {
    const [s, d] = Array.isArray(pair) ? pair : [Number.NaN, Number.NaN];
    if (!Number.isInteger(s) || s < 0 || s >= srcPages)
      throw bad(`pair ${i}: source page ${s} is out of range 0..${srcPages - 1}`);
    if (!Number.isInteger(d) || d < 0 || d >= dstPages)
      throw bad(`pair ${i}: destination page ${d} is out of range 0..${dstPages - 1}`);
    if (seen.has(d)) throw bad(`pair ${i}: destination page ${d} is written twice`);
    seen.add(d);
    flat[2 * i] = s;
    flat[2 * i + 1] = d;
  });
  return flat;
}

export const MAX_DEADLINE_MS = 24 * 3600 * 1000;

export function checkDeadline(deadlineMs: number): void {
  if (!Number.isInteger(deadlineMs) || deadlineMs < 1 || deadlineMs > MAX_DEADLINE_MS)
    throw bad(`deadlineMs must be an integer from 1 to ${MAX_DEADLINE_MS}, got ${deadlineMs}`);
}

export function toResult(r: NativeTransferResult): TransferResult {
  return {
    room: r.room,
    status: r.status,
    bytes: r.bytes,
    micros: r.micros,
    checksum: (r.checksum >>> 0).toString(16).padStart(8, '0'),
    error: r.error,
  };
}

function bad(message: string): TransferError {
  return new TransferError('TRANSFER_BAD_ARGUMENT', message);
}
