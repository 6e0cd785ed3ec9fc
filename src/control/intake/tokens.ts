/**
 * Token chunks from engines to the client streams. Tokens reach a client only from an engine the
 * committed journal gave its room: the answer's first token (chunk 0, one token) from its prefill
 * engine while the room has not reached decode (protocol 9: drawn at the end of the prefill and
 * sent ahead of the transfer), the rest from its decode engine once the KV is there
 * (`transferred`: the decode engine starts before its `decode_started` commits), and none after
 * the room ends. Anything else — a room not yet created, another engine's room, one whose id was
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

/** States of a room before its KV reached the decode engine: its prefill engine's to stream in. */
const BEFORE_DECODE: ReadonlySet<string> = new Set([
  'created',
  'bootstrapping',
  'waiting_for_input',
  'prefilling',
  'transferring',
]);

export function relayTokens(d: TokenRelayDeps, engine: string, msg: EngineMessage<'tokens'>): void {
  hop('tokens', null, msg.room);
  const view = d.book.room(msg.room);
  const stream = d.book.stream(msg.room);
  const fromPrefill =
    view?.prefillEngine === engine &&
    msg.index === 0 &&
    msg.tokens === 1 &&
    BEFORE_DECODE.has(view.state);
  const owns =
    fromPrefill ||
    (view?.decodeEngine === engine && (view.state === 'transferred' || view.state === 'decoding'));
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
    if (fromPrefill && stream)
      stream.first = { room: msg.room, token: msg.ids?.[0] ?? null, text: msg.text };
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
