/**
 * Appends from engines, on their way to the journal: each session's appends must arrive in order
 * (n = 1, 2, 3, …), each role may append only its own room events, and only for rooms the control
 * plane gave it; events the journal would refuse are recorded up to a budget, then only counted.
 * The journal's answer goes back to the engine as an ack or nack (docs/protocol.md, "Ordering,
 * replay and retries").
 */

import type { EngineMessage } from '../../bus/protocol.ts';
import { TokenBucket } from '../../bus/quotas.ts';
import type { BusServer, PeerId } from '../../bus/server.ts';
import { hop } from '../../hops.ts';
import { JournalError } from '../../journal/errors.ts';
import type { JournalLog } from '../../journal/store.ts';
import type { Logger } from '../../log.ts';
import type { Clock } from '../../ports/clock.ts';
import type { EventData } from '../../room/events.ts';
import type { ControlCounters } from '../bus.ts';
import { Listeners } from '../listeners.ts';
import type { RoomBook } from '../rooms/room-book.ts';
import type { Router } from '../routing/router.ts';
import { checkAppend } from './engine-appends.ts';
import type { EngineRegistry } from './registry.ts';

/**
 * An engine's event ids live in a namespace of their own, `engine:<id>/<its id>`, which no id the
 * control plane makes can enter (those start with a room id or are UUIDs): a peer can never occupy
 * the id of an abort or failure the control plane will append later.
 */
export function engineEventId(engine: string, eventId: string): string {
  return `engine:${engine}/${eventId}`;
}

/** How long a session broken by a failed append waits before the engine is told to say hello. */
const JOURNAL_RETRY_MS = 250;

/** Refused events an engine may have journaled per second (and in one burst) before they are only counted. */
export const REJECTIONS_PER_SECOND = 50;
const REJECTION_BURST = 500;

/** A token bucket per engine for appends the journal would record as `room.event_rejected`. */
class RejectionBudget {
  private readonly buckets = new Map<string, TokenBucket>();

  /** False when `engine` has no budget left for another rejection. Appends that fit always pass. */
  take(engine: string, rejection: boolean, now: number): boolean {
    if (!rejection) return true;
    let b = this.buckets.get(engine);
    if (!b) {
      b = new TokenBucket(REJECTIONS_PER_SECOND, REJECTION_BURST, now);
      this.buckets.set(engine, b);
    }
    return b.take(now);
  }
}

export interface AppendRelayDeps {
  journal: JournalLog;
  bus: BusServer;
  registry: EngineRegistry;
  counters: ControlCounters;
  /** Whose each room is, and whether an append would be refused given those on their way. */
  book: Pick<RoomBook, 'owners' | 'project' | 'settled' | 'stream'>;
  /** Vets the prefix blocks an engine says it stored or evicted (routing/router.ts `vet`). */
  router: Pick<Router, 'vet'>;
  /** Measures an append's latency. */
  timed<T>(p: Promise<T>): Promise<T>;
  clock: Clock;
  log: Logger;
}

/** A `room.failed` refused for its reason: what the engine claimed, of which room and pair. */
export interface RefusedClaim {
  room: string;
  /** The failure reason it gave. */
  claim: string;
  /** The other engine of the room's pair. */
  with: string;
}

export class AppendRelay {
  private readonly rejections = new RejectionBudget();
  private readonly bus: BusServer;

  /** Told of each failure an engine reported of its own room that its role cannot detect. */
  readonly refusedClaims: Listeners<[engine: string, claim: RefusedClaim]>;

  constructor(private readonly deps: AppendRelayDeps) {
    this.bus = deps.bus;
    this.refusedClaims = new Listeners(deps.log, 'refused-claim listener');
  }

  /**
   * Appends of one session must arrive as n = 1, 2, 3, … An append of an older session (it sat in
   * a dead connection's queue) is dropped; a gap means one was lost, and taking the next would
   * reorder the engine's events (transfer_posted before prefill_started): drop the rest and make
   * the engine open a new session, which resends everything unacknowledged in order.
   */
  private inSequence(peer: PeerId, engine: string, msg: EngineMessage<'append'>): boolean {
    const s = this.deps.registry.get(engine);
    if (!s || msg.session !== s.delivery.session) {
      this.bus.drops.record('stale_session', {
        engine,
        session: msg.session,
        eventId: msg.eventId,
      });
      return false;
    }
    if (msg.n < s.delivery.nextN) return true; // a resend within the session: the journal dedupes it
    if (msg.n > s.delivery.nextN || s.delivery.broken) {
      this.bus.drops.record('out_of_order', { engine, expected: s.delivery.nextN, got: msg.n });
      if (!s.delivery.broken) {
        s.delivery.broken = true;
        this.bus.send(peer, 'nack', {
          eventId: null,
          code: 'BUS_NOT_REGISTERED',
          message: `append ${s.delivery.nextN} of session ${s.delivery.session} never arrived; say hello again`,
          retryable: true,
        });
      }
      return false;
    }
    s.delivery.nextN++;
    return true;
  }

  /**
   * An append of this session was not journaled (a full disk, say) and will be sent again: the
   * appends behind it must not be journaled before it (transfer_posted would be refused for good,
   * its room stuck in prefilling). The session breaks as at a gap — later appends are dropped —
   * and after a pause, so that a journal still failing is not asked again at once, the engine is
   * told to say hello: the new session resends everything unacknowledged, in order.
   */
  private breakAt(engine: string, msg: EngineMessage<'append'>): void {
    const s = this.deps.registry.get(engine);
    if (!s || s.delivery.session !== msg.session || s.delivery.broken) return;
    s.delivery.broken = true;
    const session = s.delivery.session;
    this.deps.clock.setTimeout(() => {
      const now = this.deps.registry.get(engine);
      if (now?.delivery.session !== session) return;
      this.bus.send(now.peer, 'nack', {
        eventId: null,
        code: 'BUS_NOT_REGISTERED',
        message: `append ${msg.n} of session ${session} was not journaled; say hello again to resend from it in order`,
        retryable: true,
      });
    }, JOURNAL_RETRY_MS);
  }

  /**
   * The bytes are in the decode pages, as far as the prefill engine says: the decode engine hears
   * it now, while the event commits, so that it can load the KV and compute the first token in
   * the meantime — holding it until the commit (protocol 7, docs/critical-path.md). A decode
   * engine not yet caught up (replaying) is not told: it acts on the committed event.
   */
  private kvArrived(
    decodeEngine: string,
    room: string,
    { bytes, checksum, firstToken }: EventData<'room.transfer_completed'>,
  ): void {
    const d = this.deps.registry.get(decodeEngine);
    if (!d?.delivery.live) return;
    this.bus.send(d.peer, 'kv_arrived', {
      room,
      bytes,
      checksum,
      ...(firstToken !== undefined ? { firstToken } : {}),
    });
  }

  /**
   * Why a prefill engine's `room.transfer_completed` cannot be journaled as it is, or null: it
   * must name the answer's first token (protocol 9), and the one its client was streamed, since the
   * decode engine continues after the one it names — a client never reads one first token followed
   * by another's continuation.
   */
  private firstTokenRefusal(
    room: string,
    { firstToken }: EventData<'room.transfer_completed'>,
  ): string | null {
    if (firstToken === undefined)
      return `room.transfer_completed of ${room} names no firstToken: a prefill engine of protocol 9 draws the answer's first token and names it (docs/protocol.md)`;
    const stream = this.deps.book.stream(room);
    if (!stream || stream.current !== room || stream.done) return null;
    const streamed = stream.first?.room === room ? stream.first : null;
    const same =
      streamed === null
        ? firstToken === null
        : firstToken !== null &&
          firstToken.text === streamed.text &&
          (streamed.token === null || streamed.token === firstToken.token);
    if (same) return null;
    return `room.transfer_completed of ${room} names the first token ${JSON.stringify(firstToken)}, but its client was streamed ${streamed === null ? 'none' : JSON.stringify({ token: streamed.token, text: streamed.text })}`;
  }

  /**
   * An engine of one of the room's pair failed it for a reason its role cannot detect: the
   * claim is refused, and told to whoever weighs engines' faults (recovery/outliers.ts).
   */
  private claimRefused(engine: string, role: string, room: string, claim: string): void {
    const owners = this.deps.book.owners(room);
    if (owners === undefined) return;
    const { prefillEngine: p, decodeEngine: d } = owners;
    if ((role === 'prefill' ? p : d) !== engine) return;
    this.refusedClaims.emit(engine, { room, claim, with: engine === p ? d : p });
  }

  append(peer: PeerId, engine: string, msg: EngineMessage<'append'>): void {
    hop('arrived', msg.event.type, msg.event.room ?? null);
    if (!this.inSequence(peer, engine, msg)) return;
    const s = this.deps.registry.get(engine);
    if (!s) return;
    const { type, room } = msg.event;
    const refuse = (message: string) => {
      this.deps.counters.nacks++;
      this.bus.send(peer, 'nack', {
        eventId: msg.eventId,
        code: 'BUS_INVALID_EVENT',
        message,
        retryable: false,
      });
    };
    const checked = checkAppend(s.role, msg.event);
    if (!checked.ok) {
      this.bus.drops.record(checked.reason, { engine, type, room });
      refuse(checked.message);
      if (checked.claim !== undefined) this.claimRefused(engine, s.role, room, checked.claim);
      return;
    }
    const event = checked.event;
    const owners = this.deps.book.owners(room);
    const mine =
      owners !== undefined &&
      (s.role === 'prefill' ? owners.prefillEngine : owners.decodeEngine) === engine;
    if (!mine) {
      // Nothing is journaled for a room the engine never held: a peer cannot grow the journal
      // with events about rooms that are not its own.
      this.bus.drops.record('not_owner', { engine, type, room });
      refuse(
        owners
          ? `room ${room} belongs to ${owners.prefillEngine} (prefill) and ${owners.decodeEngine} (decode), not to ${s.role} engine ${engine}`
          : `room ${room} is not a room this control plane gave to ${engine}`,
      );
      return;
    }
    if (event.type === 'room.bootstrapped') {
      // Its pages are in its own pool: naming another engine's, or another epoch of its own, is
      // not so, and the journal is what operators read after an incident.
      const { pool, epoch } = event.data;
      if ((pool !== undefined && pool !== s.pool) || (epoch !== undefined && epoch !== s.epoch)) {
        this.bus.drops.record('bad_payload', { engine, type, room });
        refuse(
          `room.bootstrapped of ${room} names pool ${pool ?? '-'} epoch ${epoch ?? '-'}, but ${engine} registered pool ${s.pool} epoch ${s.epoch}`,
        );
        return;
      }
    }
    if (event.type === 'room.transfer_completed') {
      const refusal = this.firstTokenRefusal(room, event.data);
      if (refusal !== null) {
        this.bus.drops.record('bad_payload', { engine, type, room });
        refuse(refusal);
        return;
      }
    }
    const eventId = engineEventId(engine, msg.eventId);
    const rejected = !this.deps.book.project(event, engine, eventId);
    if (!this.rejections.take(engine, rejected, this.deps.clock.now())) {
      this.bus.drops.record('rate_limited', { engine, type, room });
      refuse(
        `${engine} sent more out-of-order events than the journal records (${REJECTIONS_PER_SECOND}/s); this one was not recorded`,
      );
      return;
    }
    this.deps.counters.appends++;
    if (!rejected && event.type === 'room.transfer_completed')
      this.kvArrived(owners.decodeEngine, room, event.data);
    const vetted = this.deps.router.vet(s, event);
    this.deps.counters.blocksRefused += vetted.refused;
    this.deps
      .timed(
        this.deps.journal.append({
          ...vetted.event,
          engine,
          source: `engine:${engine}`,
          eventId,
        }),
      )
      .finally(() => {
        if (!rejected) this.deps.book.settled(room);
      })
      .then(
        (res) => {
          const to = this.deps.registry.get(engine)?.peer ?? peer;
          // Lazy: engines go on without waiting for acknowledgements, but for the prefill
          // engine's of room.transfer_completed — an event it acts on, which goes out now
          // (acts-on.ts) and takes this along. A rejection may wait up to LAZY_MS (bus/outbox.ts).
          this.bus.send(
            to,
            'ack',
            {
              eventId: msg.eventId,
              status: res.status,
              original: res.status === 'duplicate' ? res.original : null,
              seq: res.seq,
              reason: res.status === 'rejected' ? res.reason : null,
              detail: res.status === 'rejected' ? res.detail.slice(0, 1000) : null,
            },
            true,
          );
        },
        (err) => {
          const e = JournalError.from(err);
          const retryable = e.code !== 'JOURNAL_INVALID_EVENT';
          this.deps.counters.nacks++;
          this.bus.send(this.deps.registry.get(engine)?.peer ?? peer, 'nack', {
            eventId: msg.eventId,
            code: retryable ? 'BUS_JOURNAL_UNAVAILABLE' : 'BUS_INVALID_EVENT',
            message: e.message.slice(0, 2000),
            retryable,
          });
          if (retryable) this.breakAt(engine, msg);
        },
      );
  }
}
