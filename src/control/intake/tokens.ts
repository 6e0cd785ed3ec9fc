/**
 * Token chunks from decode engines to the client streams. Tokens reach a client only from the
 * engine the committed journal made its room's decode engine, once the KV is there
 * (`transferred`: the decode engine starts before its `decode_started` commits) and before the
 * room ends. Anything else — a room not yet created, another engine's room, one whose id was
 * guessed — is refused and counted (`not_owner`); a chunk repeated is counted `duplicate`.
 */

import type { DropReason, EngineMessage } from '../../bus/protocol.ts';
import type { BusServer } from '../../bus/server.ts';
import { hop } from '../../hops.ts';
import type { ControlCounters } from '../bus.ts';
import type { EngineRegistry } from '../engines/registry.ts';
import { recordProgress } from '../evidence/engine-health.ts';
import type { RoomBook } from '../rooms/room-book.ts';

export interface TokenRelayDeps {
  readonly book: Pick<RoomBook, 'room' | 'stream'>;
  readonly registry: EngineRegistry;
  readonly bus: Pick<BusServer, 'drops'>;
  readonly counters: ControlCounters;
}

export function relayTokens(d: TokenRelayDeps, engine: string, msg: EngineMessage<'tokens'>): void {
  hop('tokens', null, msg.room);
  const view = d.book.room(msg.room);
  const stream = d.book.stream(msg.room);
  const owns =
    view?.decodeEngine === engine && (view.state === 'transferred' || view.state === 'decoding');
  const dropped: DropReason | null = !owns
    ? 'not_owner'
    : !stream
      ? 'unknown_room'
      : stream.push(msg)
        ? null
        : 'duplicate';
  const s = owns && stream ? d.registry.get(engine) : undefined;
  if (s) recordProgress(s, d.registry.clock.now());
  if (dropped === null) {
    d.counters.tokens += msg.tokens;
    return;
  }
  d.counters.tokensDropped++;
  const detail =
    dropped === 'not_owner'
      ? { state: view?.state ?? null }
      : dropped === 'duplicate'
        ? { index: msg.index }
        : {};
  d.bus.drops.record(dropped, { engine, room: msg.room, kind: 'tokens', ...detail });
}
