/**
 * The prefill role: once a room's decode pages are known — reserved in its committed
 * `room.created` (protocol 7), or else named by its committed `room.bootstrapped` — compute its KV
 * into pages of this engine's pool, post the transfer into the decode engine's pages, and report
 * how it ended. No step waits for its own event's commit: the decode engine keeps those pages
 * until this engine releases the room, so a transfer always lands in pages reserved for it, and
 * an abort stops the work wherever it is.
 */
import { hop } from '../hops.ts';
import { type EngineModel, type FirstToken, KvImageError } from '../model/executor.ts';
import type { JournalEvent } from '../room/events.ts';
import type { Fault, TransferCore } from '../transfer/core.ts';
import { hostIdentity } from '../transfer/host.ts';
import type { PagePool, PoolOpener } from '../transfer/page-pool.ts';
import { KvPool } from '../transfer/pool.ts';
import { checkPeer, type UcxNode, type UcxPoolDescriptor } from '../transfer/ucx.ts';
import { EngineCore, type EngineParts, type EngineRoom } from './engine.ts';
import { roomKv } from './kv-pages.ts';
import { prefixCacheBudget } from './options.ts';
import { type BlockReport, PrefixReuse } from './prefix-reuse.ts';

export interface PrefillParts extends EngineParts {
  /** This engine's pool: where rooms' KV is computed. */
  pool: PagePool;
  /** Moves pages into decode pools on this host. */
  core: TransferCore;
  /** Puts into pools on other hosts; null where UCX is not used (`--kv-transport shm`, or absent). */
  ucx?: UcxNode | null;
  /** Opens a decode engine's pool by name. Default: shared memory of this host (`KvPool.open`). */
  openPool?: PoolOpener;
  /** This engine's host (transfer/host.ts). Default: the machine's. */
  host?: string;
}

export class PrefillEngine extends EngineCore {
  private readonly queue: EngineRoom[] = [];
  private readonly active = new Set<string>();
  /** Rooms with a transfer in flight, and when it was posted. */
  private readonly transferring = new Map<string, number>();
  /** Decode pools by shared-memory name, opened on first use and reopened on a new epoch. */
  private readonly peers = new Map<string, PagePool>();

  private readonly pool: PagePool;
  private readonly core: TransferCore;
  private readonly ucx: UcxNode | null;
  private readonly openPool: PoolOpener;
  private readonly host: string;

  constructor(parts: PrefillParts) {
    super(parts);
    const { opts, model, pool } = parts;
    this.pool = pool;
    this.core = parts.core;
    this.ucx = parts.ucx ?? null;
    this.openPool = parts.openPool ?? ((name) => KvPool.open(name));
    this.host = parts.host ?? hostIdentity();
    this.prefixes = PrefixReuse.for({
      model,
      pool,
      allocator: this.allocator,
      blockTokens: opts.kvBlockTokens,
      budgetPages: prefixCacheBudget(opts),
      pagesPerBlock: this.pagesFor(opts.kvBlockTokens),
    });
  }

  /** What it reuses of prompts computed before (prefix-reuse.ts); null: nothing. */
  readonly prefixes: PrefixReuse | null;

  /** Pages a room could have now: free ones, and those of cached blocks it may evict. */
  override freePages(): number {
    return this.allocator.free + (this.prefixes?.evictablePages ?? 0);
  }

  /** Verdicts on peers' UCX descriptors, by descriptor. */
  private readonly peerChecks = new Map<string, Promise<string | null>>();

  queueDepths(): Record<string, number> {
    return {
      waiting: this.queue.length,
      active: this.active.size,
      transferring: this.transferring.size,
    };
  }

  /** Starts on the event that tells it where the KV goes: reserved in `room.created`, or bootstrapped. */
  protected react(room: EngineRoom, ev: JournalEvent): boolean {
    if (room.view.prefillEngine !== this.id) return false;
    const startsOn = room.reservation !== null ? 'room.created' : 'room.bootstrapped';
    if (ev.type !== startsOn) return false;
    this.enqueue(room);
    return true;
  }

  protected resume(room: EngineRoom): void {
    if (room.view.prefillEngine !== this.id) return;
    const s = room.view.state;
    if (s === 'created' || s === 'bootstrapping') {
      if (room.reservation !== null) this.enqueue(room);
    } else if (s === 'waiting_for_input') this.enqueue(room);
    else if (s === 'prefilling' || s === 'transferring') this.fail(room, 'engine_restarted', s);
  }

  private enqueue(room: EngineRoom): void {
    if (this.queue.length >= this.opts.maxQueue) {
      this.fail(room, 'prefill_queue_full', room.view.state);
      return;
    }
    this.queue.push(room);
    this.pump();
  }

  private pump(): void {
    const concurrency = Math.min(this.opts.prefillConcurrency, this.model.slots ?? Infinity);
    while (this.active.size < concurrency && this.queue.length > 0) {
      const room = this.queue.shift() as EngineRoom;
      if (room.stopped) continue;
      this.active.add(room.view.room);
      this.run(room)
        .catch((err) => {
          this.log.error({ room: room.view.room, err }, 'prefill failed unexpectedly');
          this.fail(room, 'prefill_error', room.view.state);
        })
        .finally(() => {
          this.active.delete(room.view.room);
          this.tryRelease(room);
          this.pump();
        });
    }
  }

  private async run(room: EngineRoom): Promise<void> {
    const v = room.view;
    if (!room.request) {
      this.fail(room, 'request_unavailable', v.state);
      return;
    }
    // A migrated request's context is its prompt and what was already streamed.
    const tokens = this.contextTokens(room, v.state);
    if (!tokens) return;
    const bootstrapped = await this.destination(room);
    if (!bootstrapped) return;
    const { dstPages } = bootstrapped;
    const need = this.pagesFor(tokens.length);
    if (need > dstPages.length) {
      this.fail(room, 'kv_exceeds_reservation', v.state);
      return;
    }
    const prefixes = this.prefixes;
    const { names, hits } = prefixes?.begin(v.room, tokens) ?? { names: [], hits: [] };
    try {
      let pages = this.allocator.reserve(v.room, need);
      // Rooms first: a pool that cached blocks have filled gives their pages up.
      const evicted = pages ? [] : (prefixes?.evictFor(need) ?? []);
      if (evicted.length > 0) pages = this.allocator.reserve(v.room, need);
      if (!pages) {
        this.fail(room, 'kv_pool_full', v.state);
        return;
      }
      room.pages = pages;
      void this.append(
        room,
        'room.prefill_started',
        evicted.length > 0 ? { evictedBlocks: evicted } : {},
      );
      // Let the outbox send it before the compute holds this thread: the journal's prefilling must
      // begin when the compute does, and an abort must find the room in it.
      await new Promise<void>((r) => this.clock.defer(r));
      hop('compute', null, v.room);
      const kv = roomKv(this.pool, pages, 'empty');
      const reused = prefixes?.restore(v.room, hits, kv) ?? 0;
      let computed: Awaited<ReturnType<EngineModel['prefill']>>;
      try {
        computed = await this.model.prefill(
          tokens,
          kv.pages,
          async () => {
            if (this.computeHung) await this.computeAllowed();
            this.workTicks++;
            await new Promise<void>((r) => this.clock.defer(r));
            return !room.stopped;
          },
          {
            reused,
            sampling: room.request.sampling ?? {},
            // Streamed now, ahead of the KV's save and transfer (protocol 9).
            first: (first) => this.sendFirst(room, first),
          },
        );
      } catch (err) {
        if (!(err instanceof KvImageError)) throw err;
        this.log.warn({ room: v.room, err: err.message }, 'KV does not fit the reserved pages');
        this.fail(room, 'kv_exceeds_reservation', 'prefilling');
        return;
      }
      if (computed === null || room.stopped) return;
      kv.store();
      const blocks = prefixes?.finish(names, hits, kv, computed.reused ?? 0) ?? {};
      await this.transfer(room, bootstrapped, pages, computed, blocks);
    } finally {
      prefixes?.unpin(v.room);
    }
  }

  /** Posts the room's KV to the decode engine's pages and journals how that went. */
  private async transfer(
    room: EngineRoom,
    bootstrapped: NonNullable<Awaited<ReturnType<PrefillEngine['destination']>>>,
    pages: readonly number[],
    computed: { micros: number; first: FirstToken | null },
    blocks: BlockReport,
  ): Promise<void> {
    const v = room.view;
    const need = pages.length;
    const { dstPages } = bootstrapped;
    // Not awaited: the pages written belong to the decode engine from the commit that named them
    // until this engine releases the room (docs/protocol.md, rule 7), so the transfer cannot land
    // in pages freed for another room, and an abort committed meanwhile cancels it (stop). The
    // commit of this event is no longer a round trip on the room's path.
    void this.append(room, 'room.transfer_posted', {
      pairs: need,
      bytes: need * this.opts.pageBytes,
      computeMicros: computed.micros,
      ...blocks,
    });
    this.transferring.set(v.room, this.clock.now());
    let result: Awaited<ReturnType<TransferCore['post']>>;
    const deadlineMs = room.view.deadlinesMs.transferring;
    try {
      result =
        bootstrapped.via === 'ucx'
          ? await (this.ucx as UcxNode).post({
              room: v.room,
              src: this.pool,
              pages,
              dst: bootstrapped.peer,
              deadlineMs,
            })
          : await this.core.post({
              room: v.room,
              src: this.pool,
              dst: bootstrapped.dst,
              pairs: pages.map((p, i) => [p, dstPages[i] as number] as const),
              deadlineMs,
              epoch: bootstrapped.epoch,
            });
    } finally {
      this.transferring.delete(v.room);
      this.transferTicks++;
    }
    if (result.status === 'ok') {
      await this.append(room, 'room.transfer_completed', {
        bytes: result.bytes,
        checksum: result.checksum,
        micros: result.micros,
        firstToken: computed.first,
        transport:
          bootstrapped.via === 'ucx'
            ? 'ucx'
            : this.pool.device !== null || bootstrapped.dst.device !== null
              ? 'cuda'
              : 'shm',
      });
      // Its ack says the chunk before it arrived too: nothing of the room is resent from here.
      this.forgetTokens(v.room);
    } else if (!(result.status === 'cancelled' && room.stopped)) {
      this.log.warn(
        { room: v.room, status: result.status, error: result.error },
        'transfer did not complete',
      );
      this.fail(room, `transfer_${result.status}`, 'transferring');
    }
    room.stopped = true;
  }

  /**
   * Where the room's KV goes (`room.kvTarget`: reserved, or bootstrapped): the decode pool in shared
   * memory when the decode engine is on this host (or `--kv-transport shm`), else its UCX worker,
   * which posted a receive into the reserved pages — refused when its hello's pool epoch is not
   * the reservation's (the receive is tagged with that epoch).
   */
  private async destination(
    room: EngineRoom,
  ): Promise<
    | { via: 'shm'; dst: PagePool; dstPages: number[]; epoch: number }
    | { via: 'ucx'; peer: UcxPoolDescriptor; dstPages: number[] }
    | null
  > {
    const b = room.kvTarget;
    if (!b) {
      this.fail(room, 'bootstrap_unknown', room.view.state);
      return null;
    }
    const elsewhere = b.peer?.host !== undefined && b.peer.host !== this.host;
    const t = this.opts.kvTransport;
    if (t === 'ucx' || (t === 'auto' && elsewhere)) {
      const remote = b.peer?.ucx;
      if (!this.ucx || !remote) {
        this.log.warn(
          {
            room: room.view.room,
            decode: room.view.decodeEngine,
            here: this.ucx !== null,
            there: remote !== undefined,
          },
          'the decode engine is on another host and UCX is not there on both ends',
        );
        this.fail(room, 'kv_transport_unavailable', room.view.state);
        return null;
      }
      if (remote.epoch !== b.epoch) {
        // A restarted decode engine's new pool: what it registered before is not that pool.
        this.fail(room, 'decode_pool_stale', room.view.state);
        return null;
      }
      const peer: UcxPoolDescriptor = {
        address: Buffer.from(remote.address),
        pages: remote.pages,
        pageBytes: remote.pageBytes,
        epoch: remote.epoch,
      };
      const invalid = await this.checkedPeer(peer);
      if (invalid !== null) {
        this.log.warn(
          { room: room.view.room, decode: room.view.decodeEngine, reason: invalid },
          'the decode engine’s UCX descriptor is not usable; refused',
        );
        this.fail(room, 'decode_pool_invalid', room.view.state);
        return null;
      }
      return { via: 'ucx', dstPages: b.pages, peer };
    }
    let dst = this.peers.get(b.pool);
    if (!dst || dst.epoch !== b.epoch) {
      try {
        dst?.close();
        dst = this.openPool(b.pool);
        this.peers.set(b.pool, dst);
      } catch (err) {
        this.log.warn({ room: room.view.room, pool: b.pool, err }, 'cannot open the decode pool');
        this.fail(room, 'decode_pool_unavailable', room.view.state);
        return null;
      }
    }
    return { via: 'shm', dst, dstPages: b.pages, epoch: b.epoch };
  }

  /**
   * A peer's descriptor, checked once in a throwaway process (ucx.ts `checkPeer`) before this
   * process hands its bytes to UCX; null when it is good, else why.
   */
  private checkedPeer(peer: UcxPoolDescriptor): Promise<string | null> {
    const key = peer.address.toString('base64');
    let verdict = this.peerChecks.get(key);
    if (!verdict) {
      if (this.peerChecks.size >= 64) this.peerChecks.clear();
      verdict = checkPeer(peer);
      this.peerChecks.set(key, verdict);
    }
    return verdict;
  }

  /**
   * The answer's first token, drawn at the end of the prefill, to the client now (chunk 0; the
   * decode engine's follow from 1): the control plane streams it once the committed journal names
   * this engine the room's prefill engine, without waiting for the transfer. The end of the text
   * at once sends nothing.
   */
  private sendFirst(room: EngineRoom, first: FirstToken | null): void {
    if (first === null || room.stopped) return;
    hop('first-token', null, room.view.room);
    this.sendTokens({
      room: room.view.room,
      index: 0,
      text: first.text,
      tokens: 1,
      ids: [first.token],
    });
  }

  protected stop(room: EngineRoom): void {
    room.stopped = true;
    this.forgetTokens(room.view.room);
    if (this.transferring.has(room.view.room)) {
      this.core.cancel(room.view.room);
      this.ucx?.cancel(room.view.room);
    }
    this.tryRelease(room);
  }

  protected canFree(room: EngineRoom): boolean {
    return !this.active.has(room.view.room);
  }

  override resetTransfer(olderThanMs = 0): number {
    const now = this.clock.now();
    let cancelled = 0;
    for (const [room, postedAt] of this.transferring) {
      if (now - postedAt >= olderThanMs)
        cancelled += this.core.cancel(room) + (this.ucx?.cancel(room) ?? 0) > 0 ? 1 : 0;
    }
    this.core.clearFaults();
    return cancelled;
  }

  protected override applyFault(fault: Fault): void {
    this.core.inject(fault);
    this.ucx?.inject(fault);
  }

  protected override clearFaults(): void {
    this.core.clearFaults();
    this.ucx?.clearFaults();
  }
}
