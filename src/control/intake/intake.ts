/**
 * Intake: the one path from a request to a room. A request is checked against the model, given
 * the engine pair of lowest cost that has the KV pages for it now (pairs.ts), admitted into the
 * room book and journaled `room.created`; every refusal is a ControlError with the code the API
 * maps to a status (400, 429, 503) — there is no other place that turns a request away.
 * Migration creates its continuation rooms through `create` too.
 */

import type { RoomRequest } from '../../bus/protocol.ts';
import { hop, hopClock } from '../../hops.ts';
import type { JournalLog } from '../../journal/store.ts';
import type { ModelInfo } from '../../model/executor.ts';
import { blockNames } from '../../model/prefix-blocks.ts';
import type { Clock } from '../../ports/clock.ts';
import type { Ids } from '../../ports/ids.ts';
import type { EngineSession } from '../engines/engine-session.ts';
import type { LivenessPolicy } from '../engines/engine-view.ts';
import type { EngineRegistry } from '../engines/registry.ts';
import { ControlError, refusal } from '../errors.ts';
import type { SubmitRequest } from '../options.ts';
import { couldEverFit, fitsNow, roomPages, roomTokens } from '../pages/page-ledger.ts';
import type { RoomBook } from '../rooms/room-book.ts';
import type { Router } from '../routing/router.ts';
import { checkRequest } from './check-request.ts';
import { type Pair, unreachable } from './pairs.ts';
import { RoomStream } from './streams.ts';

export interface IntakeDeps {
  journal: Pick<JournalLog, 'append' | 'health'>;
  registry: EngineRegistry;
  book: RoomBook;
  model: ModelInfo;
  liveness: Readonly<LivenessPolicy>;
  /** Rooms in flight a decode engine may hold (options.ts). */
  maxRoomsPerEngine: number;
  /** Whether the pair's KV could not move lately (pairs.ts PairHealth). */
  pairAvoided(prefill: string, decode: string): boolean;
  /** A new room was placed on the pair (pairs.ts PairHealth `taken`: a probe after a pause). */
  pairTaken(prefill: string, decode: string, room: string): void;
  /** Deadlines journaled on each new room (journal/states.ts), when not the defaults. */
  deadlinesMs?: Record<string, number>;
  /** Chooses pairs (routing/router.ts) and knows the blocks engines hold. */
  router: Router;
  /** Measures an append's latency. */
  timed<T>(p: Promise<T>): Promise<T>;
  clock: Clock;
  ids: Ids;
}

export class Intake {
  constructor(private readonly deps: IntakeDeps) {}

  /**
   * A request to a room: checked, given a pair, admitted and journaled; returns its token stream.
   * When the caller's signal fires, `abort` is asked for the room serving it then (after a
   * migration, not the first).
   */
  submit(request: SubmitRequest, abort: (room: string) => Promise<unknown>): RoomStream {
    const submitted = hopClock();
    const { sent, tokens, promptTokens, stop } = checkRequest(request, this.deps.model);
    const health = this.deps.journal.health();
    if (!health.writable || health.state !== 'ready') {
      // Nothing is served that the journal cannot record.
      throw new ControlError(
        'CONTROL_JOURNAL_UNAVAILABLE',
        `the journal cannot be written (${health.lastError ?? health.state}); not taking new requests`,
      );
    }
    const { maxTokens, requestId, traceparent, sampling, signal, tenant } = request;
    const names = blockNames(tokens, this.deps.router.o.blockTokens);
    const pair = this.pick(
      promptTokens,
      maxTokens,
      names,
      request.probe ?? null,
      request.probeAvoid,
      request.headroom,
    );
    const { clock } = this.deps;
    const room = this.deps.ids.room();
    hop('submit', null, room, submitted);
    const stream = new RoomStream(room, promptTokens, clock.now(), clock);
    stream.trace = {
      ...(requestId ? { requestId } : {}),
      ...(traceparent ? { traceparent } : {}),
      ...(tenant ? { tenant: tenant.name, band: tenant.band } : {}),
    };
    const req: RoomRequest = {
      ...sent,
      maxTokens,
      ...(stop.length > 0 ? { stop } : {}),
      ...(sampling ? { sampling } : {}),
    };
    const waited = request.waitedMs ? { waitedMs: request.waitedMs } : {};
    this.create(stream, room, req, promptTokens, pair, {
      source: request.source ?? 'api',
      names,
      ...waited,
    });
    if (signal) {
      const onAbort = () => {
        stream.cancelled = true;
        void abort(stream.current).catch(() => {});
      };
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
      void stream.result
        .finally(() => signal.removeEventListener('abort', onAbort))
        .catch(() => {});
    }
    return stream;
  }

  /**
   * The pair for a new room whose context has the block names `names`: the router's choice
   * among live engines (engine-view.ts) with the KV pages free now, passing `usable`. Null when
   * none.
   */
  pairFor(
    promptTokens: number,
    maxTokens: number,
    usable: (s: EngineSession) => boolean = () => true,
    now = this.deps.clock.now(),
    names: readonly string[] = [],
    probe: string | null = null,
    /** Room for one more of its size left after it (SubmitRequest `headroom`). */
    headroom = false,
  ): { pair: Pair | null; prefills: EngineSession[]; decodes: EngineSession[] } {
    const { registry, book, liveness } = this.deps;
    const times = headroom ? 2 : 1;
    // An engine with no pages cannot hold a room's KV, whatever it says of its KV's shape.
    const fits = (s: EngineSession) =>
      usable(s) &&
      s.pages > 0 &&
      this.hasRoom(s, times) &&
      fitsNow(s, times * roomPages(s, promptTokens, maxTokens));
    const prefills = registry.candidates('prefill', liveness, now, fits, probe);
    const decodes = registry.candidates('decode', liveness, now, fits, probe);
    const pair = this.deps.router.choose(prefills, decodes, names, promptTokens, {
      avoid: this.deps.pairAvoided,
      roomsOn: (engine) => book.liveOn(engine),
    });
    return { pair, prefills, decodes };
  }

  /** Whether the engine has `n` rooms to spare under the cap (decode engines only). */
  private hasRoom(s: EngineSession, n = 1): boolean {
    return (
      s.role !== 'decode' || this.deps.book.liveOn(s.engine) + n <= this.deps.maxRoomsPerEngine
    );
  }

  /**
   * The pair for a new room, or why there is none: CONTROL_NO_ENGINES when a role has no live
   * engine or no pair can move KV, CONTROL_ENGINES_DRAINING when every one drains,
   * CONTROL_BAD_REQUEST when no engine could ever hold the request, CONTROL_OVERLOADED (429) when
   * one could but none can now (no pages free, or every decode engine at its room cap).
   */
  pick(
    promptTokens: number,
    maxTokens: number,
    names: readonly string[] = [],
    probe: string | null = null,
    avoid: readonly string[] = [],
    headroom = false,
  ): Pair {
    const now = this.deps.clock.now();
    const usable = avoid.length === 0 ? undefined : (s: EngineSession) => !avoid.includes(s.engine);
    const { pair, prefills, decodes } = this.pairFor(
      promptTokens,
      maxTokens,
      usable,
      now,
      names,
      probe,
      headroom,
    );
    if (pair) return pair;
    const without = headroom
      ? this.pairFor(promptTokens, maxTokens, usable, now, names, probe).pair
      : null;
    if (without) {
      // A fleet that could never hold two of these at once keeps no room: the request goes.
      const twice = (s: EngineSession) =>
        couldEverFit(s, 2 * roomPages(s, promptTokens, maxTokens));
      if (this.deps.maxRoomsPerEngine < 2 || !twice(without.prefill) || !twice(without.decode))
        return without;
      throw new ControlError(
        'CONTROL_OVERLOADED',
        'the room left is kept for interactive requests while they come; retry shortly',
      );
    }
    if (prefills.length === 0) this.noneFor('prefill', promptTokens, maxTokens, now);
    if (decodes.length === 0) this.noneFor('decode', promptTokens, maxTokens, now);
    throw new ControlError('CONTROL_NO_ENGINES', unreachable(prefills, decodes));
  }

  /** Why no engine of the role can take the request (`pick`'s refusals). */
  private noneFor(
    role: 'prefill' | 'decode',
    promptTokens: number,
    maxTokens: number,
    now: number,
  ): never {
    const { registry, liveness } = this.deps;
    const need = (s: EngineSession) => roomPages(s, promptTokens, maxTokens);
    const heartbeating = registry.withStatus(role, 'live', liveness, now);
    const uncordoned = heartbeating.filter((s) => !registry.cordons.has(s.engine));
    if (uncordoned.length === 0 && heartbeating.length > 0) {
      const cordoned = heartbeating.map((s) => s.engine);
      throw refusal(
        'CONTROL_NO_ENGINES',
        `no ${role} engine takes new requests now (every one is cordoned); retry later`,
        `every ${role} engine is cordoned (${cordoned.join(', ')}): none takes new rooms; \`pdctl engines uncordon ${cordoned[0]}\` takes one back`,
      );
    }
    const live = uncordoned.filter((s) => !registry.retiring.has(s.engine));
    if (live.length === 0 && uncordoned.length > 0) {
      const retiring = uncordoned.map((s) => s.engine);
      throw refusal(
        'CONTROL_NO_ENGINES',
        `no ${role} engine takes new requests now (every one is being retired); retry later`,
        `every ${role} engine is being retired (${retiring.join(', ')}): none takes new rooms until another ${role} engine registers`,
      );
    }
    if (live.length === 0) {
      const draining = registry.withStatus(role, 'draining', liveness, now).map((s) => s.engine);
      if (draining.length > 0)
        throw refusal(
          'CONTROL_ENGINES_DRAINING',
          `no ${role} engine takes new requests now (every one is draining); retry later`,
          `every ${role} engine is draining (${draining.join(', ')}): none takes new rooms; \`pdctl engines undrain ${draining[0]}\` takes one back`,
        );
      throw new ControlError(
        'CONTROL_NO_ENGINES',
        `no ${role} engine is registered with a heartbeat in the last ${liveness.staleAfterMs} ms`,
      );
    }
    if (!live.some((s) => this.hasRoom(s)))
      throw new ControlError(
        'CONTROL_OVERLOADED',
        `every ${role} engine has ${this.deps.maxRoomsPerEngine} rooms in flight; retry shortly`,
      );
    const largest = live.reduce((a, b) => (b.pages > a.pages ? b : a));
    const tokens = roomTokens(largest, promptTokens, maxTokens);
    const what =
      tokens > promptTokens
        ? `${tokens} tokens of KV (prompt ${promptTokens} + max_tokens ${maxTokens})`
        : `${tokens} prompt tokens of KV`;
    if (!live.some((s) => couldEverFit(s, need(s)))) {
      throw new ControlError(
        'CONTROL_BAD_REQUEST',
        `the request needs ${what}, ${need(largest)} pages, but the largest ${role} KV pool has ${largest.pages} pages; ask for fewer max_tokens or a shorter prompt`,
      );
    }
    const free = Math.max(...live.map((s) => s.pages - s.load.reservedPages));
    throw new ControlError(
      'CONTROL_OVERLOADED',
      `no ${role} engine has the KV pages for ${what} free now (most free: ${free} of ${largest.pages} pages); retry shortly`,
    );
  }

  /**
   * Admits the stream's request on the pair into the room book and the router's queue, and
   * journals its `room.created` with the prefix blocks the router expects the prefill engine to
   * hold; a journal that refuses it takes the room out again and fails the stream
   * (CONTROL_JOURNAL_UNAVAILABLE). `names`: the context's block names (made here when absent).
   */
  create(
    stream: RoomStream,
    room: string,
    request: RoomRequest,
    promptTokens: number,
    { prefill, decode, transport }: Pair,
    o: {
      source: string;
      migratedFrom?: string;
      retriedFrom?: string;
      names?: readonly string[];
      waitedMs?: number;
    },
  ): void {
    const { book, deadlinesMs, router } = this.deps;
    const names = o.names ?? this.namesOf(request);
    const reservation = book.admit(room, { stream, request, promptTokens, prefill, decode });
    this.deps.pairTaken(prefill.engine, decode.engine, room);
    const expected = router.admitted(room, prefill.engine, names, promptTokens);
    const owners = { prefillEngine: prefill.engine, decodeEngine: decode.engine };
    const abandon = (err: Error) => {
      router.forget(room);
      book.abandon(room, owners)?.fail(err);
    };
    this.deps
      .timed(
        this.deps.journal.append({
          type: 'room.created',
          room,
          source: o.source,
          data: {
            ...owners,
            promptTokens,
            maxTokens: request.maxTokens,
            model: this.deps.model.name,
            transport,
            ...(names.length > 0 ? { prefixBlocks: names.length, expectedBlocks: expected } : {}),
            ...(request.sampling ? { sampling: request.sampling } : {}),
            ...stream.trace,
            ...(o.migratedFrom ? { migratedFrom: o.migratedFrom } : {}),
            ...(o.retriedFrom ? { retriedFrom: o.retriedFrom } : {}),
            ...(o.waitedMs ? { waitedMs: o.waitedMs } : {}),
            ...(deadlinesMs ? { deadlinesMs } : {}),
            ...(reservation ? { reservation } : {}),
          },
        }),
      )
      .then(
        (res) => {
          if (res.status === 'applied') stream.markAdmitted();
          else
            abandon(
              new ControlError('CONTROL_JOURNAL_UNAVAILABLE', `room.created was ${res.status}`),
            );
        },
        (err) =>
          abandon(
            new ControlError(
              'CONTROL_JOURNAL_UNAVAILABLE',
              `the journal refused the room: ${(err as Error).message}`,
              { cause: err },
            ),
          ),
      );
  }

  /** The block names of a request's context (a migration's continuation includes what was generated). */
  private namesOf(request: RoomRequest): string[] {
    try {
      return blockNames(this.deps.model.contextTokens(request), this.deps.router.o.blockTokens);
    } catch {
      return [];
    }
  }
}
