/**
 * The decode role: claim the pages the control plane reserved for a new room (or, without a
 * reservation, choose them; fail it cleanly when that cannot be), verify the KV that arrived
 * against the transfer's checksum, then decode step by step, streaming token chunks, and complete
 * the room. Its pages are freed only when no transfer can still be writing into them: before they
 * were named in a committed event, after the transfer completed, or once the prefill engine has
 * released the room.
 */

import { wasApplied } from '../bus/client.ts';
import type { ControlMessage, EngineMessage } from '../bus/protocol.ts';
import { hop } from '../hops.ts';
import {
  type DecodeStep,
  type DecodeStream,
  type FirstToken,
  KvImageError,
} from '../model/executor.ts';
import type { JournalEvent } from '../room/events.ts';
import type { PagePool } from '../transfer/page-pool.ts';
import type { UcxNode } from '../transfer/ucx.ts';
import { EngineCore, type EngineParts, type EngineRoom } from './engine.ts';
import { roomKv } from './kv-pages.ts';

/**
 * Longest stretch of decode steps between two returns to the event loop, in ms: with a heavy model
 * and many rooms, one pass over all of them could otherwise keep the engine from reading its bus
 * (aborts, new rooms) for long enough to look wedged.
 */
const PASS_BUDGET_MS = 20;

/** Held on the hint past its first own token: what it does next waits on the transfer's commit. */
function waitsOnCommit(d: Decoding): boolean {
  return d.held !== null && (d.generated > d.firstIndex || d.held.finished);
}

interface Decoding {
  room: EngineRoom;
  /** Null until the model has loaded the KV that arrived. */
  stream: DecodeStream | null;
  /** A step (or the start) is being computed off this thread. */
  pending: boolean;
  generated: number;
  maxTokens: number;
  chunk: string;
  chunkTokens: number;
  chunkIds: number[];
  chunkIndex: number;
  /**
   * This engine's first chunk index, and the tokens of `generated` it did not compute: 1 after
   * the first token from the prefill engine (protocol 9), 0 where the text ended at once.
   */
  firstIndex: number;
  computeMicros: number;
  /** The request's stop sequences, and the end of its text so far (enough to find one in). */
  stops: readonly string[];
  tail: string;
  /** A stop sequence appeared, or the model ended the text: `finishReason: stop`. */
  stopped: boolean;
  /**
   * Started on the `kv_arrived` hint (its checksum) and held: nothing leaves this engine — no
   * `room.decode_started`, no tokens, no completion — until `room.transfer_completed` commits.
   * Null once it did (or when it started on the commit).
   */
  held: {
    checksum: string;
    firstToken: FirstToken | null;
    chunks: Array<EngineMessage<'tokens'>>;
    finished: boolean;
  } | null;
}

/** What the decode of a room starts from: the KV's checksum and the answer's first token. */
interface Arrived {
  checksum: string;
  firstToken: FirstToken | null | undefined;
}

function sameToken(a: FirstToken | null | undefined, b: FirstToken | null | undefined): boolean {
  return a === b || (a != null && b != null && a.token === b.token && a.text === b.text);
}

/** Whether `tail` (text so far, its last `longest - 1` characters and the newest step) holds a stop. */
function stopIn(d: Decoding, step: string): boolean {
  if (d.stops.length === 0) return false;
  const longest = Math.max(...d.stops.map((s) => s.length));
  d.tail = (d.tail + step).slice(-(longest - 1 + step.length));
  const hit = d.stops.some((s) => d.tail.includes(s));
  d.tail = d.tail.slice(-(longest - 1));
  return hit;
}

export interface DecodeParts extends EngineParts {
  /** This engine's pool: the pages rooms' KV is received into. */
  pool: PagePool;
  incarnation: string;
  ucx?: UcxNode | null;
}

export class DecodeEngine extends EngineCore {
  private readonly running = new Map<string, Decoding>();
  private scheduled = false;
  /** First tokens computed on a hint and thrown away, per room, until its release says so. */
  private readonly wasted = new Map<string, number>();
  /**
   * The UCX receives posted into rooms' reserved pages, until each ended: the KV is verified only
   * after its receive ended, and the pages are freed only then (UCX may be writing into them).
   */
  private readonly receiving = new Map<string, Promise<void>>();

  private readonly pool: PagePool;
  /** This process's incarnation: a reservation made for another one is not for its pool. */
  private readonly incarnation: string;
  /** Receives rooms' KV from prefill engines on other hosts; null where UCX is not used. */
  private readonly ucx: UcxNode | null;

  constructor(parts: DecodeParts) {
    super(parts);
    this.pool = parts.pool;
    this.incarnation = parts.incarnation;
    this.ucx = parts.ucx ?? null;
  }

  /**
   * Rooms the work loop has to move. One held on the hint past its first token waits on the
   * transfer's commit — its prefill engine's append, the journal — not on this engine's loop,
   * so it is not counted: a frozen prefill engine does not make its decode partners look stuck.
   */
  queueDepths(): Record<string, number> {
    let decoding = 0;
    for (const d of this.running.values()) if (!waitsOnCommit(d)) decoding++;
    return { decoding };
  }

  protected react(room: EngineRoom, ev: JournalEvent): boolean {
    if (room.view.decodeEngine !== this.id) return false;
    if (ev.type === 'room.created') this.bootstrap(room);
    else if (ev.type === 'room.transfer_completed') {
      // The KV came another way than the pair was expected to use: no message is coming.
      if (ev.data.transport !== 'ucx' && this.receiving.has(room.view.room))
        this.ucx?.cancel(room.view.room);
      this.afterReceive(room, () => {
        const d = this.running.get(room.view.room);
        if (d?.held) this.confirm(d);
        else this.startDecoding(room, null);
      });
    } else return false;
    return true;
  }

  /**
   * The prefill engine's `room.transfer_completed` reached the control plane (not yet committed):
   * verify the KV and compute the first token now, holding it (docs/critical-path.md, step 3).
   */
  override onKvArrived(msg: ControlMessage<'kv_arrived'>): void {
    hop('kv-arrived', null, msg.room);
    const room = this.rooms.get(msg.room);
    if (!room || room.view.decodeEngine !== this.id || room.stopped || room.transferDone) return;
    if (this.running.has(msg.room)) return;
    this.afterReceive(room, () => {
      if (!this.running.has(msg.room) && !room.transferDone)
        this.startDecoding(room, { checksum: msg.checksum, firstToken: msg.firstToken });
    });
  }

  /**
   * Runs `then` once the room's UCX receive (if one is posted) ended: its bytes are all in the
   * pages, or never will be — the checksum then says which. At once when there is none.
   */
  private afterReceive(room: EngineRoom, then: () => void): void {
    const pending = this.receiving.get(room.view.room);
    if (!pending) {
      then();
      return;
    }
    // Its appends answer the event that asked for them, whatever arrived meanwhile.
    const cause = room.cause;
    void pending.then(() => {
      const latest = room.cause;
      room.cause = cause;
      then();
      room.cause = latest;
    });
  }

  /**
   * Posts the UCX receive of the room's KV into the pages its prompt takes: the prefill engine on
   * another host sends there, and nowhere else in this process can it write.
   */
  private receiveKv(room: EngineRoom, pages: number[]): void {
    const ucx = this.ucx as UcxNode;
    const id = room.view.room;
    const done = ucx.receive({ room: id, pool: this.pool, pages }).then(
      (r) => {
        if (r.status !== 'ok' && !room.stopped)
          this.log.warn(
            { room: id, status: r.status, error: r.error },
            'the KV receive did not complete; the checksum decides',
          );
      },
      (err: unknown) =>
        this.log.warn(
          { room: id, err: (err as Error).message },
          'the KV receive could not be posted',
        ),
    );
    this.receiving.set(id, done);
    void done.then(() => {
      this.receiving.delete(id);
      if (room.stopped) this.tryRelease(room);
    });
  }

  /** The transfer committed: what was held goes out, and decoding goes on. */
  private confirm(d: Decoding): void {
    const { room } = d;
    const held = d.held as NonNullable<Decoding['held']>;
    if (held.checksum !== room.view.checksum || !sameToken(held.firstToken, room.firstToken)) {
      // The commit says other bytes or another first token than the hint did: start again from
      // the committed event.
      this.discard(d);
      this.startDecoding(room, null);
      return;
    }
    d.held = null;
    void this.append(room, 'room.decode_started', {});
    for (const chunk of held.chunks) this.sendTokens(chunk);
    if (held.finished) this.complete(d);
    else this.schedule();
  }

  /** Speculative work thrown away: its tokens are counted on the room's release. */
  private discard(d: Decoding): void {
    const room = d.room.view.room;
    this.leave(room);
    d.stream?.close();
    const own = d.generated - d.firstIndex;
    if (own > 0) this.wasted.set(room, (this.wasted.get(room) ?? 0) + own);
  }

  protected resume(room: EngineRoom): void {
    // A restarted decode engine lost every page it had reserved: only a room that has not
    // reached it yet can go on.
    if (room.view.decodeEngine !== this.id) return;
    if (room.view.state === 'created') this.bootstrap(room);
    else this.fail(room, 'engine_restarted', room.view.state);
  }

  /**
   * `room.bootstrap_started` and `room.bootstrapped` leave in the same turn, so the control plane
   * commits them in one transaction. The pages are the ones the control plane reserved in
   * `room.created` (this engine claims exactly those) or, without a reservation, chosen here;
   * they are this engine's own from then on. An abort committed first reaches this engine before
   * the acks, and stop() frees them; a refusal for any other reason frees them too.
   */
  private bootstrap(room: EngineRoom): void {
    const r = room.reservation;
    if (r && r.incarnation !== this.incarnation) {
      // Reserved in the pool of this engine's last process (it restarted while the room was
      // admitted): as lost as a room past `created`. The control plane migrates it.
      this.fail(room, 'engine_restarted', 'created');
      return;
    }
    void this.append(room, 'room.bootstrap_started', {});
    // Pages for the prompt's KV, and for every token decode may add where it decodes in the pool.
    const prompt = room.view.promptTokens ?? 0;
    const total = prompt + (this.model.kv.decodeGrows ? (room.view.maxTokens ?? 0) : 0);
    const count = this.pagesFor(total);
    let pages: number[] | null;
    if (r) {
      const refused = this.refusal(room, r, count);
      if (refused) {
        // The control plane's page map and this pool disagree: by docs/critical-path.md that
        // cannot happen, so it is logged as the defect it is, and the room fails cleanly.
        this.log.error(
          { room: room.view.room, reservation: r, refused },
          'kv reservation refused: the control plane reserved pages this pool cannot give',
        );
        this.fail(room, 'kv_reservation_refused', 'bootstrapping');
        return;
      }
      pages = [...r.pages];
    } else {
      pages = this.allocator.reserve(room.view.room, count);
      if (!pages) {
        this.fail(room, 'kv_pool_full', 'bootstrapping');
        return;
      }
    }
    room.pages = pages;
    if (room.transport === 'ucx' && this.ucx)
      this.receiveKv(room, pages.slice(0, this.pagesFor(prompt)));
    void this.append(room, 'room.bootstrapped', {
      pages,
      pool: this.pool.name,
      epoch: this.pool.epoch,
    }).then((ack) => {
      if (wasApplied(ack) || room.released) return;
      room.stopped = true;
      this.tryRelease(room);
    });
  }

  /** Claims the reserved pages for the room; null when it holds them, else why it cannot. */
  private refusal(
    room: EngineRoom,
    r: NonNullable<EngineRoom['reservation']>,
    count: number,
  ): string | null {
    if (r.pool !== this.pool.name || r.epoch !== this.pool.epoch)
      return `reserved in pool ${r.pool} epoch ${r.epoch}, this is ${this.pool.name} epoch ${this.pool.epoch}`;
    if (r.pages.length !== count)
      return `${r.pages.length} pages reserved, the room takes ${count} here`;
    return this.allocator.claim(room.view.room, r.pages);
  }

  /**
   * Verifies the KV that arrived and starts decoding after the answer's first token (the prefill
   * engine drew and streamed it: protocol 9): on the committed `room.transfer_completed` (`hint`
   * null), or held on the `kv_arrived` hint — then a mismatch or an unusable request only means no
   * speculation: the committed event decides.
   */
  private startDecoding(room: EngineRoom, hint: Arrived | null): void {
    const pages = room.pages;
    const v = room.view;
    if (!pages || room.stopped) return;
    if (!room.request) {
      if (hint === null) this.fail(room, 'request_unavailable', 'transferred');
      return;
    }
    const first = hint === null ? room.firstToken : hint.firstToken;
    if (first === undefined) {
      if (hint !== null) return;
      // Written by a prefill engine before protocol 9, which no control plane of this version
      // admits: there is nothing to continue after.
      this.log.error({ room: v.room }, 'room.transfer_completed names no first token');
      this.fail(room, 'decode_error', 'transferred');
      return;
    }
    const start = first === null ? 0 : 1;
    const d: Decoding = {
      room,
      stream: null,
      pending: true,
      generated: start,
      maxTokens: v.maxTokens ?? 0,
      chunk: '',
      chunkTokens: 0,
      chunkIds: [],
      chunkIndex: start,
      firstIndex: start,
      computeMicros: 0,
      stops: room.request.stop ?? [],
      // After a migration, a stop may begin in the text streamed before it.
      tail: room.request.generated ?? '',
      stopped: false,
      held:
        hint === null
          ? null
          : { checksum: hint.checksum, firstToken: first, chunks: [], finished: false },
    };
    // The first token may end the answer — the end of the text, a stop sequence, max_tokens — and
    // then the KV is never read: the room completes.
    d.stopped = first === null || stopIn(d, first.text);
    const ended = first === null || d.stopped || d.generated >= d.maxTokens;
    if (!ended) {
      const promptTokens = v.promptTokens ?? 0;
      const checksum = this.pool.checksumPages(pages.slice(0, this.pagesFor(promptTokens)));
      const expected = hint?.checksum ?? v.checksum;
      if (checksum !== expected) {
        if (hint !== null) return;
        this.log.warn(
          { room: v.room, expected, got: checksum },
          'KV checksum mismatch after transfer',
        );
        this.fail(room, 'kv_checksum_mismatch', 'transferred');
        return;
      }
    }
    let tokens: number[] | null;
    if (hint === null) tokens = this.contextTokens(room, 'transferred');
    else {
      try {
        tokens = this.model.contextTokens(room.request);
      } catch {
        return;
      }
    }
    if (!tokens) return;
    if (hint === null) void this.append(room, 'room.decode_started', {});
    this.running.set(v.room, d);
    if (first === null || ended) {
      d.pending = false;
      if (d.held) d.held.finished = true;
      else this.complete(d);
      return;
    }
    const kv = roomKv(this.pool, pages, 'load');
    hop(hint === null ? 'load' : 'load-on-hint', null, v.room);
    this.model.startDecode(tokens, first, kv.pages, room.request.sampling ?? {}).then(
      (stream) => {
        hop('loaded', null, v.room);
        if (this.running.get(v.room) !== d) {
          stream.close();
          return;
        }
        d.stream = stream;
        d.pending = false;
        this.schedule();
      },
      (err: unknown) => {
        if (this.running.get(v.room) !== d) return;
        this.leave(v.room);
        // Held: the committed event starts it again, and fails it if it fails again.
        if (d.held) return;
        const bad = err instanceof KvImageError;
        this.log.warn(
          { room: v.room, err: (err as Error).message },
          bad ? 'the KV that arrived is not a usable image' : 'decode could not start',
        );
        this.fail(room, bad ? 'kv_image_invalid' : 'decode_error', 'decoding');
      },
    );
  }

  /**
   * Whether the room can take a step now: not waiting on the model, and not held on a hint past
   * its first token (a hold ends with the commit, which schedules a pass).
   */
  private canStep(d: Decoding): d is Decoding & { stream: DecodeStream } {
    return !d.pending && d.stream !== null && !waitsOnCommit(d) && !this.heldForInteractive(d);
  }

  /**
   * A batch room waits while an interactive one has not sent its first chunk yet, on a model
   * whose steps run one after another (`serialSteps`): its steps would otherwise take turns on
   * the device with the interactive room's and double that room's time to first token. Only
   * until then, so a stream of interactive rooms delays batch ones, never starves them. A model
   * that batches its steps steps every room.
   */
  private heldForInteractive(d: Decoding): boolean {
    if (!this.model.serialSteps || d.room.band !== 'batch') return false;
    for (const o of this.running.values())
      if (o.room.band !== 'batch' && o.chunkIndex === o.firstIndex && !o.room.stopped) return true;
    return false;
  }

  /** The room decodes no more here; a batch room it held back may go on. */
  private leave(room: string): void {
    this.running.delete(room);
    this.schedule();
  }

  private anyCanStep(): boolean {
    for (const d of this.running.values()) if (this.canStep(d)) return true;
    return false;
  }

  /**
   * A pass on the next turn, when a room can take a step: rooms waiting on the model or held
   * schedule one when that ends, so an engine with nothing to step does not spin.
   */
  private schedule(): void {
    if (this.scheduled || !this.anyCanStep()) return;
    this.scheduled = true;
    const go = () => {
      if (this.computeHung) {
        this.clock.setTimeout(go, 20);
        return;
      }
      this.scheduled = false;
      this.pass();
    };
    this.clock.defer(go);
  }

  /**
   * One decode step for every running room (continuous batching), then back to the event loop. A
   * model that computes off this thread gets every room's step asked for before any is awaited.
   */
  private pass(): void {
    this.workTicks++;
    const budgetEnd = this.clock.monotonic() + PASS_BUDGET_MS;
    for (const d of [...this.running.values()]) {
      if (this.clock.monotonic() > budgetEnd) break;
      // Waiting on the model, or held on the hint past the first token until the transfer commits.
      if (!this.canStep(d)) continue;
      // Round robin across passes: a room that had its step goes to the back.
      this.running.delete(d.room.view.room);
      if (d.room.stopped) continue;
      this.running.set(d.room.view.room, d);
      let step: ReturnType<DecodeStream['next']>;
      try {
        step = d.stream.next();
      } catch (err) {
        this.decodeFailed(d, err);
        continue;
      }
      if (step instanceof Promise) {
        d.pending = true;
        step.then(
          (s) => {
            d.pending = false;
            if (this.running.get(d.room.view.room) !== d) return;
            this.took(d, s);
            this.schedule();
          },
          (err: unknown) => {
            d.pending = false;
            if (this.running.get(d.room.view.room) === d) this.decodeFailed(d, err);
          },
        );
      } else {
        this.took(d, step);
      }
    }
    this.schedule();
  }

  private decodeFailed(d: Decoding, err: unknown): void {
    if (d.held) {
      // Held on the hint: the committed event starts it again, and fails it if it fails again.
      this.discard(d);
      return;
    }
    this.log.error({ room: d.room.view.room, err }, 'decode step failed');
    this.leave(d.room.view.room);
    d.stream?.close();
    this.fail(d.room, 'decode_error', 'decoding');
  }

  /** A room's step is in: stream it (in chunks), and complete the room when it is done. */
  private took(d: Decoding, step: DecodeStep | null): void {
    if (step === null) {
      d.stopped = true;
    } else {
      d.generated++;
      d.computeMicros += step.micros;
      d.chunk += step.text;
      d.chunkTokens++;
      d.chunkIds.push(step.token);
      d.stopped = stopIn(d, step.text);
    }
    const finished = d.stopped || d.generated >= d.maxTokens;
    if (d.chunkTokens >= this.opts.chunkTokens || (finished && d.chunkTokens > 0)) {
      const chunk = {
        room: d.room.view.room,
        index: d.chunkIndex++,
        text: d.chunk,
        tokens: d.chunkTokens,
        ids: d.chunkIds,
      };
      if (d.held) d.held.chunks.push(chunk);
      else this.sendTokens(chunk);
      d.chunk = '';
      d.chunkTokens = 0;
      d.chunkIds = [];
    }
    if (!finished) return;
    if (d.held) {
      d.held.finished = true;
      d.stream?.close();
      d.stream = null;
    } else this.complete(d);
  }

  private complete(d: Decoding): void {
    this.leave(d.room.view.room);
    d.stream?.close();
    void this.append(d.room, 'room.completed', {
      tokens: d.generated,
      computeMicros: d.computeMicros,
      // Last: a journal stores the few reasons once and appends them back (sqlite/event-rows.ts).
      finishReason: d.stopped ? 'stop' : 'length',
    });
  }

  protected stop(room: EngineRoom): void {
    room.stopped = true;
    const d = this.running.get(room.view.room);
    if (d?.held) this.discard(d);
    else {
      d?.stream?.close();
      this.leave(room.view.room);
    }
    // Ended (its completion was committed after every chunk) or abandoned: nothing to resend.
    this.forgetTokens(room.view.room);
    if (this.receiving.has(room.view.room)) this.ucx?.cancel(room.view.room);
    this.tryRelease(room);
  }

  /** The prefill engine is gone: no message is coming, so the receive is cancelled first. */
  protected override forceRelease(room: EngineRoom): void {
    if (this.receiving.has(room.view.room)) this.ucx?.cancel(room.view.room);
    super.forceRelease(room);
  }

  protected override releaseData(room: EngineRoom): { speculativeTokens?: number } {
    const n = this.wasted.get(room.view.room);
    this.wasted.delete(room.view.room);
    return n ? { speculativeTokens: n } : {};
  }

  /**
   * Once the pages are named in a committed event — the reservation of `room.created` (protocol
   * 7), or else `room.bootstrapped` — the prefill engine may write into them: it waits for no
   * commit of its own before the transfer. So they are freed only after the transfer completed or
   * the prefill engine released the room (or is known to be gone), even when this engine failed
   * the room before claiming them.
   */
  protected canFree(room: EngineRoom): boolean {
    if (this.receiving.has(room.view.room)) return false;
    return room.kvTarget === null || room.transferDone || room.peerReleased;
  }
}
