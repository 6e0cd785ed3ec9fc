/**
 * What a lying engine says on the wire (`lie-protocol`, shape `foreign`): its `tokens` messages,
 * which no journal holds, rewritten as its DEALER sends them — before the simulated network
 * carries them — by a bus transport wrapped around the engine's own. Its appends are rewritten
 * earlier, where the engine makes them (fleet.ts `says`). A batch is opened and packed again, so a
 * lie travels as the engine's other messages do.
 */
import { Packr } from 'msgpackr';
import type { EngineMessage } from '../bus/protocol.ts';
import { BATCH_KIND, encodeBatch, encodePayload } from '../bus/protocol.ts';
import type { BusTransport, DealerSocket, Frames } from '../bus/transport.ts';

/** Rewrites one `tokens` message; the same object when it says it as it is. */
export type TokensLie = (msg: EngineMessage<'tokens'>) => EngineMessage<'tokens'>;

const packr = new Packr({ useRecords: false, mapsAsObjects: true, moreTypes: false });

/** One message of kind `kind`, its payload rewritten where it is a `tokens` that `lie` changes. */
function told(kind: string, payload: Buffer, lie: TokensLie): Buffer {
  if (kind !== 'tokens') return payload;
  const msg = packr.unpack(payload) as EngineMessage<'tokens'>;
  const said = lie(msg);
  return said === msg ? payload : encodePayload(said);
}

/** The frames a DEALER sends ([kind, payload], or a batch of them), as the liar says them. */
export function sayFrames(frames: Frames, lie: TokensLie): Frames {
  const [kind, payload] = frames;
  if (frames.length !== 2 || kind === undefined || !Buffer.isBuffer(payload)) return frames;
  const k = kind.toString();
  if (k !== BATCH_KIND) return [kind, told(k, payload, lie)];
  const { items } = packr.unpack(payload) as { items: Array<[string, Buffer]> };
  return [kind, encodeBatch(items.map(([ik, ip]) => [ik, told(ik, ip, lie)] as const))];
}

/** `inner`, but every DEALER it makes sends what `lie` (asked at each send) makes of it. */
export function lyingTransport(inner: BusTransport, lie: () => TokensLie | null): BusTransport {
  return {
    router: (spec) => inner.router(spec),
    dealer(spec) {
      const socket = inner.dealer(spec);
      const wrapped: DealerSocket = {
        get closed() {
          return socket.closed;
        },
        send: (frames) => {
          const now = lie();
          return socket.send(now ? sayFrames(frames, now) : frames);
        },
        receive: () => socket.receive(),
        close: () => socket.close(),
        connect: (endpoint) => socket.connect(endpoint),
        nextEvent: () => socket.nextEvent(),
      };
      return wrapped;
    },
  };
}
