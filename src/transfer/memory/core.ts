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
} from '../core.ts';
import { TransferError } from '../errors.ts';
import {
  checkDeadline,
  flatPairs,
  type TransferResult,
  type TransferStatus,
} from '../in-flight.ts';
import type { PagePool } from '../page-pool.ts';
import { crc32c } from '../pool.ts';
import { MemoryPool } from './pool.ts';

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
  private readonly running = new Set<Running>();
  private readonly releaseWaiters = new Map<string, Array<() => void>>();
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
      return Promise.resolve(this.start(request));
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
    return new Promise((resolve) => {
      const entry: Running = {
        room,
        timer: null as unknown as Timer,
        finish: (status, error = null) => {
          if (!this.running.delete(entry)) return;
          this.clock.clear(entry.timer);
          let checksum = '00000000';
          if (status === 'ok') {
            const moved = new Uint8Array(bytes);
            for (let i = 0; i < count; i++) {
              const page = src.page(pairs[2 * i] as number);
              moved.set(page, i * src.pageBytes);
              dst.page(pairs[2 * i + 1] as number).set(page);
            }
            checksum = crc32c(moved);
            if (fault?.kind === 'corrupt') {
              const first = dst.page(pairs[1] as number);
              first[0] = (first[0] as number) ^ 0xff;
            }
            this.counts.bytes += bytes;
          }
          this.count(status);
          resolve({
            room,
            status,
            bytes: status === 'ok' ? bytes : 0,
            micros: Math.round((this.clock.monotonic() - started) * 1000),
            checksum,
            error,
          });
          this.released(room);
        },
      };
      this.running.add(entry);
      if (dst.retired || dst.epoch !== epoch) {
        entry.timer = this.clock.setTimeout(
          () =>
            entry.finish(
              'epoch_mismatch',
              'the destination pool was re-created since the transfer was prepared',
            ),
          0,
        );
        return;
      }
      const takes =
        this.latencyMs + bytes / this.bytesPerMs + (fault?.kind === 'delay' ? (fault.ms ?? 0) : 0);
      if (fault?.kind === 'stall' || takes > deadlineMs) {
        entry.timer = this.clock.setTimeout(
          () => entry.finish('stalled', 'no progress before the deadline'),
          deadlineMs,
        );
      } else if (fault?.kind === 'fail') {
        entry.timer = this.clock.setTimeout(
          () => entry.finish('failed', 'injected failure'),
          this.latencyMs,
        );
      } else {
        entry.timer = this.clock.setTimeout(() => entry.finish('ok'), takes);
      }
    });
  }

  private count(status: TransferStatus): void {
    if (status === 'epoch_mismatch') this.counts.epochMismatch++;
    else this.counts[status]++;
  }

  cancel(room: string): number {
    let n = 0;
    for (const r of [...this.running]) {
      if (r.room !== room) continue;
      r.finish('cancelled', 'cancelled');
      n++;
    }
    return n;
  }

  release(room: string): Promise<void> {
    if (![...this.running].some((r) => r.room === room)) return Promise.resolve();
    return new Promise((resolve) => {
      const waiters = this.releaseWaiters.get(room) ?? [];
      waiters.push(resolve);
      this.releaseWaiters.set(room, waiters);
    });
  }

  private released(room: string): void {
    if ([...this.running].some((r) => r.room === room)) return;
    for (const w of this.releaseWaiters.get(room) ?? []) w();
    this.releaseWaiters.delete(room);
  }

  inject(fault: Fault): void {
    checkFault(fault);
    this.faults.unshift(fault);
  }

  clearFaults(): void {
    this.faults.length = 0;
  }

  stats(): TransferStats {
    return { ...this.counts, queued: 0, running: this.running.size, inFlight: this.running.size };
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const r of [...this.running]) r.finish('cancelled', 'the transfer core closed');
  }
}

function memoryPool(pool: PagePool): MemoryPool {
  if (pool instanceof MemoryPool) return pool;
  throw new TransferError(
    'TRANSFER_BAD_ARGUMENT',
    `pool ${pool.name} is not an in-memory pool: the in-memory transfer core moves only those`,
  );
}
