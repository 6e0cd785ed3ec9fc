/**
 * CURVE on the bus: encryption, and an allow list of engine keys. On by default wherever the bus
 * is not an `ipc://` socket in a private directory (admission.ts `needsCurve`). The control plane
 * holds a key pair; an engine must know the control plane's public key and have its own key pair.
 * With `allow`, only engines whose public key is allowed can complete the handshake: a ZAP handler
 * in this process answers libzmq's authentication requests. Which engine id a key may speak for is
 * admission.ts's business. Keys are Z85 strings of 40 characters.
 */
import * as zmq from 'zeromq';
import type { Logger } from '../log.ts';
import { z85Encode } from './admission.ts';

export interface CurveServerKeys {
  publicKey: string;
  secretKey: string;
  /** Which engine public keys may join (asked at each handshake); absent: any key. */
  allow?: (key: string) => boolean;
}

export interface CurveClientKeys {
  publicKey: string;
  secretKey: string;
  /** The control plane's public key. */
  serverKey: string;
}

/**
 * The ZAP handler (RFC 27): a ROUTER on `inproc://zeromq.zap.01` that libzmq asks about every
 * CURVE handshake on sockets of this context. One per process; it stops when closed.
 */
export class ZapHandler {
  private readonly socket = new zmq.Router();
  denied = 0;

  private constructor(
    private readonly allowed: (key: string) => boolean,
    private readonly log: Logger,
  ) {}

  static async start(allow: (key: string) => boolean, log: Logger): Promise<ZapHandler> {
    const h = new ZapHandler(allow, log);
    try {
      await h.socket.bind('inproc://zeromq.zap.01');
    } catch (err) {
      h.socket.close();
      throw new Error(
        `cannot start the bus's CURVE key check (${(err as Error).message}): one process holds one control plane with CURVE; start another in its own process, or stop the first`,
        { cause: err },
      );
    }
    void h.run();
    return h;
  }

  private async run(): Promise<void> {
    try {
      for await (const frames of this.socket) {
        // [routing id, empty, version, request id, domain, address, identity, mechanism, key...]
        const [id, , version, requestId, , address, , mechanism, key] = frames;
        if (!id || !requestId) continue;
        let ok = false;
        if (mechanism?.toString() === 'CURVE' && key && key.length === 32) {
          ok = this.allowed(z85Encode(key));
        }
        if (!ok) {
          this.denied++;
          this.log.warn(
            { address: address?.toString() },
            'bus: refused an engine whose CURVE key is not allowed',
          );
        }
        await this.socket.send([
          id,
          Buffer.alloc(0),
          version ?? '1.0',
          requestId,
          ok ? '200' : '400',
          ok ? 'OK' : 'key not allowed',
          '',
          Buffer.alloc(0),
        ]);
      }
    } catch (err) {
      if (!this.socket.closed) this.log.error({ err }, 'bus: ZAP handler stopped');
    }
  }

  close(): void {
    this.socket.close();
  }
}
