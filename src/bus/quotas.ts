/**
 * Per-peer quotas on the bus: how many messages and hellos one connection may send, so that one
 * admitted engine (a compromised host, a buggy build) cannot make the control plane's receive loop
 * so busy that healthy engines look stalled. A message over its quota is dropped before it is
 * decoded, which costs a map lookup; the first drop of an episode is reported once, so that the
 * control plane can journal it once (docs/security.md).
 */

/** A token bucket: `ratePerSecond` sustained, `burst` at once. */
export class TokenBucket {
  private tokens: number;
  private at: number;

  constructor(
    private readonly ratePerSecond: number,
    private readonly burst: number,
    now: number,
  ) {
    this.tokens = burst;
    this.at = now;
  }

  take(now: number, n = 1): boolean {
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.at) / 1000) * this.ratePerSecond);
    this.at = now;
    if (this.tokens < n) return false;
    this.tokens -= n;
    return true;
  }
}

export interface PeerQuotaOptions {
  /**
   * Messages (of any kind, each message of a batch counted) one connection may send per second,
   * sustained. Default 20,000: an engine of a busy stack sends a few thousand.
   */
  messagesPerSecond: number;
  /** Messages one connection may send at once. Default 40,000. */
  messagesBurst: number;
  /**
   * Hellos one connection may send per second, sustained. Default 0.5: an engine says hello
   * once per connection, and again each second while no welcome came.
   */
  hellosPerSecond: number;
  /** Hellos one connection may send at once. Default 5. */
  hellosBurst: number;
}

export const DEFAULT_PEER_QUOTAS: Readonly<PeerQuotaOptions> = Object.freeze({
  messagesPerSecond: 20_000,
  messagesBurst: 40_000,
  hellosPerSecond: 0.5,
  hellosBurst: 5,
});

/** What ran over: all of a peer's messages, or its hellos. */
export type QuotaKind = 'messages' | 'hellos';

/** A peer starts a new throttling episode once it kept within its quotas this long. */
const EPISODE_QUIET_MS = 10_000;
/** Peers silent this long are forgotten (a reconnecting attacker cannot grow the map for ever). */
const FORGET_AFTER_MS = 60_000;

interface PeerState {
  messages: TokenBucket;
  hellos: TokenBucket;
  lastSeen: number;
  /** When the current episode's last drop was; null: not throttled. */
  throttledAt: number | null;
  dropped: number;
}

export type QuotaVerdict =
  | { ok: true }
  /** `first`: the first drop of an episode — report it (once). */
  | { ok: false; kind: QuotaKind; first: boolean };

export class PeerQuotas {
  private readonly peers = new Map<string, PeerState>();
  private sweptAt = 0;

  constructor(readonly options: Readonly<PeerQuotaOptions> = DEFAULT_PEER_QUOTAS) {}

  /** Charges `count` messages from `peer` (`hellos` of them hellos); false drops them all. */
  admit(peer: string, count: number, hellos: number, now = Date.now()): QuotaVerdict {
    const o = this.options;
    let p = this.peers.get(peer);
    if (!p) {
      p = {
        messages: new TokenBucket(o.messagesPerSecond, o.messagesBurst, now),
        hellos: new TokenBucket(o.hellosPerSecond, o.hellosBurst, now),
        lastSeen: now,
        throttledAt: null,
        dropped: 0,
      };
      this.peers.set(peer, p);
      this.sweep(now);
    }
    p.lastSeen = now;
    const kind: QuotaKind | null = !p.messages.take(now, count)
      ? 'messages'
      : hellos > 0 && !p.hellos.take(now, hellos)
        ? 'hellos'
        : null;
    if (kind === null) {
      if (p.throttledAt !== null && now - p.throttledAt > EPISODE_QUIET_MS) p.throttledAt = null;
      return { ok: true };
    }
    const first = p.throttledAt === null;
    p.throttledAt = now;
    p.dropped += count;
    return { ok: false, kind, first };
  }

  /** Messages dropped from `peer` so far. */
  dropped(peer: string): number {
    return this.peers.get(peer)?.dropped ?? 0;
  }

  private sweep(now: number): void {
    if (now - this.sweptAt < FORGET_AFTER_MS) return;
    this.sweptAt = now;
    for (const [peer, p] of this.peers)
      if (now - p.lastSeen > FORGET_AFTER_MS) this.peers.delete(peer);
  }
}
