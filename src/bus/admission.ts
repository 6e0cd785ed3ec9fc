/**
 * Who may join the bus as which engine. Every engine holds a CURVE key pair; the control plane
 * knows, per engine id, the public key allowed to speak for it (the engines it spawned get a fresh
 * pair each; engines started by hand are listed with `--engine-key ID=PUBLIC`). A hello carries
 * proof that its sender holds the secret half of an allowed key: an HMAC over the hello's identity
 * fields, keyed with the X25519 secret that only that engine and this control plane can compute.
 *
 * The proof is needed on top of CURVE's own allow list because a ROUTER cannot tell which CURVE
 * key a message came in under (zeromq.js exposes no message metadata): without it, a peer holding
 * one allowed key could claim to be any engine. It also holds where CURVE is off (`--insecure-bus`,
 * or `ipc://` in a private directory): admission never depends on transport encryption.
 */
import {
  createHmac,
  createPrivateKey,
  createPublicKey,
  diffieHellman,
  randomBytes,
  timingSafeEqual,
} from 'node:crypto';
import { statSync } from 'node:fs';
import { dirname } from 'node:path';
import * as zmq from 'zeromq';
import { BusError } from './errors.ts';

/** A key pair as `pdctl keys` prints it: Z85 strings of 40 characters. */
export interface KeyPair {
  publicKey: string;
  secretKey: string;
}

/** What a hello carries to prove who sent it (docs/protocol.md, "Admission"). */
export interface HelloAuth {
  /** The engine's public key (Z85). */
  key: string;
  /** Unix ms when the hello was made; a hello older (or newer) than `HELLO_MAX_SKEW_MS` is refused. */
  ts: number;
  /** base64 HMAC-SHA256 of `helloProofText(...)`, keyed with X25519(engine secret, control public). */
  mac: string;
}

/** How far a hello's `ts` may be from the control plane's clock. */
export const HELLO_MAX_SKEW_MS = 120_000;

/** The fields a hello's proof covers. */
export interface HelloIdentity {
  engine: string;
  role: string;
  incarnation: string;
}

function helloProofText(id: HelloIdentity, ts: number): string {
  return `pdctl-hello/1\n${id.engine}\n${id.role}\n${id.incarnation}\n${ts}`;
}

/** Signs a hello: what an engine sends as `auth`. */
export function signHello(
  id: HelloIdentity,
  engineKeys: KeyPair,
  serverPublicKey: string,
  now = Date.now(),
): HelloAuth {
  const secret = sharedSecret(engineKeys.secretKey, serverPublicKey);
  const mac = createHmac('sha256', secret).update(helloProofText(id, now)).digest('base64');
  return { key: engineKeys.publicKey, ts: now, mac };
}

export type AdmissionVerdict = { ok: true; key: string } | { ok: false; reason: string };

/**
 * The control plane's admission policy: its own key pair and the keys allowed per engine id
 * (`*` for a key that may speak for any id, as `--engine-key *=PUBLIC` says).
 */
export class Admission {
  private readonly allowed = new Map<string, Set<string>>();
  /** Key pairs made here for engines this process spawns, by engine id. */
  private readonly issued = new Map<string, KeyPair>();

  constructor(readonly server: KeyPair = newKeyPair()) {
    checkKey('control plane public key', server.publicKey);
    checkKey('control plane secret key', server.secretKey);
  }

  /**
   * The key pair of an engine this process spawns: made on first use and allowed for that id
   * only; the same pair every time after (a restarted engine keeps its key).
   */
  issue(engine: string): KeyPair {
    let pair = this.issued.get(engine);
    if (!pair) {
      pair = newKeyPair();
      this.issued.set(engine, pair);
      this.allow(engine, pair.publicKey);
    }
    return pair;
  }

  /** The environment that gives a spawned engine its keys (read by `pdctl engine`). */
  engineEnv(engine: string): Record<string, string> {
    const pair = this.issue(engine);
    return {
      PDCTL_CURVE_SERVER_KEY: this.server.publicKey,
      PDCTL_CURVE_PUBLIC_KEY: pair.publicKey,
      PDCTL_CURVE_SECRET_KEY: pair.secretKey,
    };
  }

  /** Whether any engine may use `key` (CURVE's allow list asks this at each handshake). */
  knows(key: string): boolean {
    for (const keys of this.allowed.values()) if (keys.has(key)) return true;
    return false;
  }

  /**
   * Lets `key` speak for `engine`. A key speaks for one engine id: allowing it for a second one is
   * refused, since whoever holds it could then read and write the rooms of both. `*` lets a key
   * speak for any id, and is for trusted single-tenant set-ups only (docs/security.md).
   */
  allow(engine: string, key: string): this {
    checkKey(`public key of engine ${engine}`, key);
    for (const [other, keys] of this.allowed) {
      if (other !== engine && keys.has(key)) {
        throw new BusError(
          'BUS_UNAUTHORIZED',
          `key ${key.slice(0, 8)}… is already allowed for engine ${other}; a key speaks for one engine id — give ${engine} a key pair of its own (pdctl keys)`,
        );
      }
    }
    let keys = this.allowed.get(engine);
    if (!keys) {
      keys = new Set();
      this.allowed.set(engine, keys);
    }
    keys.add(key);
    return this;
  }

  /**
   * Checks a hello's proof. `heldBy` is the key the engine's current session was admitted with,
   * if it has one: a new incarnation must come with the same key.
   */
  verify(
    id: HelloIdentity,
    auth: HelloAuth | undefined,
    heldBy: string | null,
    now = Date.now(),
  ): AdmissionVerdict {
    if (!auth) {
      return {
        ok: false,
        reason: `engine ${id.engine} sent no admission proof: this control plane admits only engines it spawned or whose key it was given (--engine-key ${id.engine}=PUBLIC); start the engine with its key pair (PDCTL_CURVE_PUBLIC_KEY, PDCTL_CURVE_SECRET_KEY) and the control plane's public key (PDCTL_CURVE_SERVER_KEY)`,
      };
    }
    const keys = this.allowed.get(id.engine);
    if (!keys?.has(auth.key) && !this.allowed.get('*')?.has(auth.key)) {
      return {
        ok: false,
        reason: `key ${auth.key.slice(0, 8)}… may not speak for engine ${id.engine}; give the control plane --engine-key ${id.engine}=PUBLIC`,
      };
    }
    if (heldBy !== null && heldBy !== auth.key) {
      return {
        ok: false,
        reason: `engine ${id.engine} is registered under another key; a new incarnation must use the same key`,
      };
    }
    if (!Number.isFinite(auth.ts) || Math.abs(now - auth.ts) > HELLO_MAX_SKEW_MS) {
      return {
        ok: false,
        reason: `hello timestamp ${auth.ts} is more than ${HELLO_MAX_SKEW_MS / 1000} s from the control plane's clock (${now}); check the clocks`,
      };
    }
    let expected: Buffer;
    let got: Buffer;
    try {
      expected = createHmac('sha256', sharedSecret(this.server.secretKey, auth.key))
        .update(helloProofText(id, auth.ts))
        .digest();
      got = Buffer.from(auth.mac, 'base64');
    } catch (err) {
      return { ok: false, reason: `bad admission proof: ${(err as Error).message}` };
    }
    if (got.length !== expected.length || !timingSafeEqual(got, expected)) {
      return {
        ok: false,
        reason: `admission proof of engine ${id.engine} does not verify: it was not made with the secret key of ${auth.key.slice(0, 8)}… and this control plane's public key`,
      };
    }
    return { ok: true, key: auth.key };
  }
}

/**
 * The routing id of one engine connection: the engine and incarnation (for people reading a
 * capture), then 96 random bits, new for every connection. The control plane sends an engine's
 * messages to the connection its hello came on; the ROUTER never gives that routing id to a
 * second connection while the first lives, and nobody else can guess the next one.
 */
export function connectionRoutingId(
  engine: string,
  incarnation: string,
  nonce: string = randomBytes(12).toString('hex'),
): string {
  const who = `${engine}/${incarnation}`.slice(0, 200);
  return `${who}/${nonce}`;
}

export function newKeyPair(): KeyPair {
  return zmq.curveKeyPair();
}

/**
 * Whether the bus at `endpoint` needs CURVE: every endpoint but `ipc://` in a directory that only
 * this user can enter (there, file permissions already keep other users out).
 */
export function needsCurve(endpoint: string): boolean {
  if (!endpoint.startsWith('ipc://')) return true;
  try {
    const st = statSync(dirname(endpoint.slice('ipc://'.length)));
    return (st.mode & 0o077) !== 0 || st.uid !== process.getuid?.();
  } catch {
    return true;
  }
}

/** `ID=PUBLIC` (or `*=PUBLIC`), as `--engine-key` takes it. */
export function parseEngineKey(text: string): { engine: string; key: string } {
  const at = text.indexOf('=');
  const engine = at > 0 ? text.slice(0, at) : '';
  const key = text.slice(at + 1);
  if (at <= 0 || !Z85_RE.test(key)) {
    throw new BusError(
      'BUS_MALFORMED_FRAME',
      `--engine-key takes ID=PUBLIC (or *=PUBLIC for any engine id), where PUBLIC is the engine's 40-character public key from \`pdctl keys\`; got "${text.slice(0, 60)}"`,
    );
  }
  return { engine, key };
}

const Z85_RE = /^[0-9a-zA-Z.\-:+=^!/*?&<>()[\]{}@%$#]{40}$/;
const ALPHABET =
  '0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#';

export function checkKey(name: string, key: unknown): string {
  if (typeof key !== 'string' || !Z85_RE.test(key)) {
    throw new BusError(
      'BUS_MALFORMED_FRAME',
      `${name} must be a 40-character Z85 CURVE key (make one with \`pdctl keys\`), got ${typeof key === 'string' ? `${key.length} characters` : typeof key}`,
    );
  }
  return key;
}

/** Z85 encoding (ZeroMQ RFC 32) of a 32-byte key. */
export function z85Encode(data: Buffer): string {
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

export function z85Decode(text: string): Buffer {
  checkKey('key', text);
  const out = Buffer.alloc(32);
  for (let i = 0; i < 8; i++) {
    let value = 0;
    for (let j = 0; j < 5; j++) value = value * 85 + ALPHABET.indexOf(text[i * 5 + j] as string);
    out.writeUInt32BE(value >>> 0, i * 4);
  }
  return out;
}

/** X25519 of a secret and a public key (CURVE keys are Curve25519 keys), through DER wrappers. */
const PKCS8_X25519 = Buffer.from('302e020100300506032b656e04220420', 'hex');
const SPKI_X25519 = Buffer.from('302a300506032b656e032100', 'hex');
function sharedSecret(secretZ85: string, publicZ85: string): Buffer {
  const privateKey = createPrivateKey({
    key: Buffer.concat([PKCS8_X25519, z85Decode(secretZ85)]),
    format: 'der',
    type: 'pkcs8',
  });
  const publicKey = createPublicKey({
    key: Buffer.concat([SPKI_X25519, z85Decode(publicZ85)]),
    format: 'der',
    type: 'spki',
  });
  return diffieHellman({ privateKey, publicKey });
}
