/**
 * Optional CURVE security for the bus (off by default; loopback needs none). The control plane
 * holds a key pair; an engine must know the control plane's public key and have its own key pair.
 * With `allow`, only engines whose public key is listed can join: a ZAP handler in this process
 * answers libzmq's authentication requests. Keys are Z85 strings of 40 characters.
 */
import * as zmq from 'zeromq';
import type { Logger } from '../log.ts';
import { BusError } from './errors.ts';

export interface CurveServerKeys {
  publicKey: string;
  secretKey: string;
  /** Engine public keys allowed to join; absent: any engine that knows our public key. */
  allow?: string[];
}

export interface CurveClientKeys {
  publicKey: string;
  secretKey: string;
  /** The control plane's public key. */
  serverKey: string;
}

const Z85 = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;

export function checkKey(name: string, key: unknown): string {
  if (typeof key !== 'string' || !Z85.test(key)) {
    throw new BusError(
      'BUS_MALFORMED_FRAME',
      `${name} must be a 40-character Z85 CURVE key (make one with \`pdctl keys\`), got ${typeof key === 'string' ? `${key.length} characters` : typeof key}`,
    );
  }
  return key;
}

export function newKeyPair(): { publicKey: string; secretKey: string } {
  return zmq.curveKeyPair();
}

/**
 * The ZAP handler (RFC 27): a ROUTER on `inproc://zeromq.zap.01` that libzmq asks about every
 * CURVE handshake on sockets of this context. One per process; it stops when closed.
 */
export class ZapHandler {
  private readonly socket = new zmq.Router();
  private readonly allowed: Set<string>;
  denied = 0;

  private constructor(
    allow: string[],
    private readonly log: Logger,
  ) {
    this.allowed = new Set(allow);
  }

  static async start(allow: string[], log: Logger): Promise<ZapHandler> {
    const h = new ZapHandler(allow, log);
    await h.socket.bind('inproc://zeromq.zap.01');
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
          ok = this.allowed.has(z85Encode(key));
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

/** Z85 encoding (ZeroMQ RFC 32) of a 32-byte key. */
const ALPHABET =
  '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';
function z85Encode(data: Buffer): string {
  let out = '';
  for (let i = 0; i < data.length; i += 4) {
    let value = data.readUInt32BE(i);
    let chunk = '';
    for (let j = 0; j < 5; j++) {
      chunk = (ALPHABET[value % 85] as string) + chunk;
      value = Math.floor(value / 85);
    }
    out += chunk;
  }
  return out;
}
