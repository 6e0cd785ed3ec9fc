/**
 * What a prefill engine is told of a room's decode engine, with the events that say where the
 * room's KV goes — a `room.created` with a reservation (protocol 7), a `room.bootstrapped`: where
 * the decode engine runs, and how a prefill engine on another host reaches its pool, to pick the
 * transport (docs/protocol.md, "Across hosts"). Without a host (an engine that did not say), it
 * is taken for the prefill's.
 */
import type { KvRemote } from '../../bus/protocol.ts';
import type { JournalEvent } from '../../room/events.ts';
import type { EngineRegistry } from './registry.ts';

export interface KvPeer {
  host?: string;
  ucx?: KvRemote;
}

/** The `kvPeer` to send with this event to the room's prefill engine (none for other events). */
export function kvPeerFor(
  ev: JournalEvent,
  registry: Pick<EngineRegistry, 'get'>,
): { kvPeer?: KvPeer } {
  let decode: string | null = null;
  if (ev.type === 'room.created' && ev.data.reservation) decode = ev.data.decodeEngine;
  else if (ev.type === 'room.bootstrapped') decode = ev.engine;
  else return {};
  const d = decode === null ? undefined : registry.get(decode);
  return {
    kvPeer: {
      ...(d?.host ? { host: d.host } : {}),
      ...(d?.kvRemote ? { ucx: d.kvRemote } : {}),
    },
  };
}
