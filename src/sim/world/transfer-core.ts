/**
 * The simulator's transfer core (issue 41): the `TransferCore` contract (core.ts) between
 * `MemoryPool`s, on a `Clock`. A transfer takes `latencyMs` plus its bytes at `bytesPerMs`; the
 * pages are copied when it completes, so a cancel or a deadline before then leaves the
 * destination untouched. The drills' faults act as the native core's do:
 *
 * - `stall`: nothing moves; the transfer ends `stalled` at its deadline (or `cancelled`);
 * - `delay:ms`: the copy starts `ms` later;
 * - `corrupt`: one byte of the first destination page is flipped after the copy, and the
 *   checksum reported is the source's, so the decode engine's check catches it;
 * - `fail`: the transfer ends `failed`;
 *
 * and a destination pool re-created since the transfer was prepared ends it `epoch_mismatch`.
 */
import type { Clock, Timer } from '../../ports/clock.ts';
import {
  checkFault,
  type Fault,
  type TransferCore,
  type TransferRequest,
  type TransferStats,
} from '../../transfer/core.ts';
import { TransferError } from '../../transfer/errors.ts';
import {
  checkDeadline,
  flatPairs,
  InFlight,
  type TransferResult,
  type TransferStatus,
} from '../../transfer/in-flight.ts';
import type { PagePool } from '../../transfer/page-pool.ts';
import { crc32c } from '../../transfer/pool.ts';
import { MemoryPool } from './pools.ts';

export interface MemoryTransferOptions {
  /** Fixed cost of one transfer, in ms. Default 0.2. */
  latencyMs?: number;
  /** Bytes moved per ms. Default 10 MB/ms (10 GB/s). */
  bytesPerMs?: number;
}

interface Running {
  room: string;
  timer: Timer;
  finish: (status: TransferStatus, error?: string | null) => void;
}

export class MemoryTransferCore implements TransferCore {
  /** The promise of each posted transfer and its room's `release`, as the native core keeps them. */
  private readonly inFlight = new InFlight();
  private readonly running = new Map<number, Running>();
  private readonly faults: Fault[] = [];
  private readonly counts = {
    bytes: 0,
    ok: 0,
    cancelled: 0,
    stalled: 0,
    epochMismatch: 0,
    failed: 0,
  };
  private closed = false;
  private readonly latencyMs: number;
  private readonly bytesPerMs: number;

  constructor(
    private readonly clock: Clock,
    options: MemoryTransferOptions = {},
  ) {
    this.latencyMs = options.latencyMs ?? 0.2;
    this.bytesPerMs = options.bytesPerMs ?? 10_000_000;
  }

  post(request: TransferRequest): Promise<TransferResult> {
    try {
      return this.start(request);
    } catch (err) {
      return Promise.reject(TransferError.from(err));
    }
  }

  private start(request: TransferRequest): Promise<TransferResult> {
    if (this.closed)
      throw new TransferError('TRANSFER_WORKERS_CLOSED', 'the transfer core is closed');
    const { room, deadlineMs } = request;
    const src = memoryPool(request.src);
    const dst = memoryPool(request.dst);
    if (src.pageBytes !== dst.pageBytes)
      throw new TransferError(
        'TRANSFER_BAD_ARGUMENT',
        `page sizes differ: ${src.name} has ${src.pageBytes} B pages, ${dst.name} ${dst.pageBytes} B`,
      );
    const pairs = flatPairs(request.pairs, src.pages, dst.pages);
    checkDeadline(deadlineMs);
    const epoch = request.epoch ?? dst.epoch;
    const count = pairs.length / 2;
    const bytes = count * src.pageBytes;
    const started = this.clock.monotonic();
    const fault = this.faults.find((f) => f.room === undefined || f.room === room) ?? null;
    const id = this.inFlight.id();
    const result = this.inFlight.track(id, room);
    const entry: Running = {
      room,
      timer: null as unknown as Timer,
      finish: (status, error = null) => {
        if (!this.running.delete(id)) return;
        this.clock.clear(entry.timer);
        let checksum = 0;
        if (status === 'ok') {
          const moved = new Uint8Array(bytes);
          for (let i = 0; i < count; i++) {
            const page = src.page(pairs[2 * i] as number);
            moved.set(page, i * src.pageBytes);
            dst.page(pairs[2 * i + 1] as number).set(page);
          }
          checksum = Number.parseInt(crc32c(moved), 16);
          if (fault?.kind === 'corrupt') {
            const first = dst.page(pairs[1] as number);
            first[0] = (first[0] as number) ^ 0xff;
          }
          this.counts.bytes += bytes;
        }
        if (status === 'epoch_mismatch') this.counts.epochMismatch++;
        else this.counts[status]++;
        const micros = Math.round((this.clock.monotonic() - started) * 1000);
        this.inFlight.completed({
          id,
          room,
          status,
          bytes: status === 'ok' ? bytes : 0,
          micros,
          checksum,
          error,
        });
      },
    };
    this.running.set(id, entry);
    const at = (ms: number, status: TransferStatus, error: string | null = null) => {
      entry.timer = this.clock.setTimeout(() => entry.finish(status, error), ms);
    };
    const takes =
      this.latencyMs + bytes / this.bytesPerMs + (fault?.kind === 'delay' ? (fault.ms ?? 0) : 0);
    if (dst.retired || dst.epoch !== epoch)
      at(
        0,
        'epoch_mismatch',
        'the destination pool was re-created since the transfer was prepared',
      );
    else if (fault?.kind === 'stall' || takes > deadlineMs)
      at(deadlineMs, 'stalled', 'no progress before the deadline');
    else if (fault?.kind === 'fail') at(this.latencyMs, 'failed', 'injected failure');
    else at(takes, 'ok');
    return result;
  }

  cancel(room: string): number {
    let n = 0;
    for (const r of [...this.running.values()]) {
      if (r.room !== room) continue;
      r.finish('cancelled', 'cancelled');
      n++;
    }
    return n;
  }

  release(room: string): Promise<void> {
    return this.inFlight.release(room);
  }

  inject(fault: Fault): void {
    checkFault(fault);
    this.faults.unshift(fault);
  }

  clearFaults(): void {
    this.faults.length = 0;
  }

  stats(): TransferStats {
    const running = this.running.size;
    return { ...this.counts, queued: 0, running, inFlight: this.inFlight.size };
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const r of [...this.running.values()]) r.finish('cancelled', 'the transfer core closed');
  }
}

function memoryPool(pool: PagePool): MemoryPool {
  if (pool instanceof MemoryPool) return pool;
  throw new TransferError(
    'TRANSFER_BAD_ARGUMENT',
    `pool ${pool.name} is not an in-memory pool: the in-memory transfer core moves only those`,
  );
}
