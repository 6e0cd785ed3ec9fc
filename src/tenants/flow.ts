/**
 * Flow control's order: which waiting request is tried next. Requests that find no engine with
 * pages free, or their tenant at its own limit, wait here instead of being refused at once:
 *
 * - **Bands in strict order.** Every interactive request is tried before any batch request; when
 *   the fleet has no room for the interactive request whose turn it is, no batch request goes
 *   either (it would take the pages the interactive one waits for).
 * - **Fair shares by tokens within a band.** Each tenant of a band has a virtual time, the tokens
 *   (prompt and `max_tokens`) of the requests taken from it; the backlogged tenant with the least
 *   goes next. A tenant that starts waiting is brought up to the least of those waiting, so time
 *   spent idle is not credit to flood with later. A tenant held out by its own limits is passed
 *   over without holding the others.
 * - **A time-to-live** per request: its band's, or shorter when its client asked so.
 * - **A bound**: past `maxQueued` waiting, the lowest band is shed first — within it, the newest
 *   request of the tenant whose backlog ends furthest ahead of its share (its virtual time and the
 *   tokens it has waiting), so a tenant that floods the queue is shed and not those it crowds
 *   out. A request whose own tenant is that one is refused itself.
 *
 * Pure and synchronous: the caller (control/flow/) says when to look again and what trying a
 * request does; the same order runs in the simulator and in `pdctl serve`.
 */
import type { Band } from './book.ts';

/** Bands from first to last: the order requests are taken in, the reverse of the order shed in. */
export const BAND_ORDER: readonly Band[] = ['interactive', 'batch'];

/** What held a request back the last time it was tried (its API error code, were it refused then). */
export const WAIT_REASONS = [
  'overloaded',
  'no_engines',
  'tenant_concurrency_limit',
  'tenant_token_limit',
] as const;
export type WaitReason = (typeof WAIT_REASONS)[number];

export interface FlowTicket {
  requestId: string;
  /** The tenant it is fair between; '' on an open API (one tenant, shared by all). */
  tenant: string;
  band: Band;
  /** What it costs of its tenant's share: prompt tokens and `max_tokens`. */
  tokens: number;
  enqueuedAt: number;
  /** Taken by then or refused: its enqueue time and its time-to-live. */
  deadline: number;
  /** What held it back last (null: not tried yet). */
  waitingFor: WaitReason | null;
}

/**
 * What trying a ticket came to: taken (`admitted`), held by its tenant's own limits (`tenant`: the
 * tenant is passed over this round), by the fleet (`fleet`: nothing more is tried this round), or
 * failed for good (`failed`: the caller answered it; it leaves the queue).
 */
export type Attempt =
  | { kind: 'admitted' }
  | { kind: 'tenant'; reason: WaitReason }
  | { kind: 'fleet'; reason: WaitReason }
  | { kind: 'failed' };

interface BandQueue<T> {
  /** Each backlogged tenant's waiting tickets, oldest first. */
  tenants: Map<string, T[]>;
  /** Each tenant's virtual time: the tokens taken from it, raised to the band's when it returns. */
  vt: Map<string, number>;
  /** The virtual time of the last ticket taken: where a tenant that starts waiting starts. */
  now: number;
}

export class FlowQueue<T extends FlowTicket> {
  private readonly bands = new Map<Band, BandQueue<T>>(
    BAND_ORDER.map((b) => [b, { tenants: new Map(), vt: new Map(), now: 0 }]),
  );
  private count = 0;

  constructor(private readonly maxQueued: number) {}

  get size(): number {
    return this.count;
  }

  /**
   * Places `t` in its band. At the bound, a ticket makes room and is returned (the caller refuses
   * it): `victim`'s choice, `t` itself when its own tenant is the one to shed.
   */
  push(t: T): T | null {
    let shed: T | null = null;
    if (this.count >= this.maxQueued) {
      shed = this.victim(t);
      if (shed === t) return t;
      this.remove(shed);
    }
    const q = this.band(t.band);
    let waiting = q.tenants.get(t.tenant);
    if (!waiting) {
      // Back from idle: no credit for the time it did not wait.
      q.vt.set(t.tenant, Math.max(q.vt.get(t.tenant) ?? 0, this.least(q) ?? q.now));
      waiting = [];
      q.tenants.set(t.tenant, waiting);
    }
    waiting.push(t);
    this.count++;
    return shed;
  }

  /** Takes `t` out (its client left, it expired); false when it was not waiting. */
  remove(t: T): boolean {
    const q = this.band(t.band);
    const waiting = q.tenants.get(t.tenant);
    const i = waiting?.indexOf(t) ?? -1;
    if (!waiting || i < 0) return false;
    waiting.splice(i, 1);
    if (waiting.length === 0) this.idle(q, t.tenant);
    this.count--;
    return true;
  }

  /**
   * Tries waiting tickets in order — bands strictly, tenants by least virtual time — until the
   * fleet holds one back or none is left to try. Returns the tickets taken, in order.
   */
  pump(attempt: (t: T) => Attempt): T[] {
    const taken: T[] = [];
    for (const band of BAND_ORDER) {
      const q = this.band(band);
      const passed = new Set<string>();
      for (;;) {
        const tenant = this.next(q, passed);
        if (tenant === null) break;
        const waiting = q.tenants.get(tenant) as T[];
        const t = waiting[0] as T;
        const r = attempt(t);
        if (r.kind === 'tenant') {
          // Every request of the tenant waits for the same limit.
          for (const w of waiting) w.waitingFor = r.reason;
          passed.add(tenant);
          continue;
        }
        if (r.kind === 'fleet') {
          t.waitingFor = r.reason;
          return taken;
        }
        waiting.shift();
        this.count--;
        if (r.kind === 'admitted') {
          const vt = (q.vt.get(tenant) ?? 0) + t.tokens;
          q.now = q.vt.get(tenant) ?? 0;
          q.vt.set(tenant, vt);
          taken.push(t);
        }
        if (waiting.length === 0) this.idle(q, tenant);
      }
    }
    return taken;
  }

  /** The tickets whose deadline is before `before` (taken out), oldest first. */
  expire(before: number): T[] {
    const out: T[] = [];
    for (const t of this.tickets()) if (t.deadline < before) out.push(t);
    for (const t of out) this.remove(t);
    return out.sort((a, b) => a.enqueuedAt - b.enqueuedAt);
  }

  /** The earliest deadline among waiting tickets (null: none waits). */
  nextDeadline(): number | null {
    let d: number | null = null;
    for (const t of this.tickets()) if (d === null || t.deadline < d) d = t.deadline;
    return d;
  }

  /** Every waiting ticket, band by band. */
  *tickets(): Generator<T> {
    for (const band of BAND_ORDER)
      for (const waiting of this.band(band).tenants.values()) yield* waiting;
  }

  /** The oldest waiting ticket of `band` (null: none waits there). */
  oldest(band: Band): T | null {
    let o: T | null = null;
    for (const waiting of this.band(band).tenants.values()) {
      const t = waiting[0];
      if (t && (o === null || t.enqueuedAt < o.enqueuedAt)) o = t;
    }
    return o;
  }

  private band(b: Band): BandQueue<T> {
    return this.bands.get(b) as BandQueue<T>;
  }

  /** The backlogged tenant of `q` with the least virtual time, not in `passed` (ties: by name). */
  private next(q: BandQueue<T>, passed: Set<string>): string | null {
    let best: string | null = null;
    let bestVt = 0;
    for (const tenant of q.tenants.keys()) {
      if (passed.has(tenant)) continue;
      const vt = q.vt.get(tenant) ?? 0;
      if (best === null || vt < bestVt || (vt === bestVt && tenant < best)) {
        best = tenant;
        bestVt = vt;
      }
    }
    return best;
  }

  /** The least virtual time among the backlogged tenants of `q` (null: none). */
  private least(q: BandQueue<T>): number | null {
    let least: number | null = null;
    for (const tenant of q.tenants.keys()) {
      const vt = q.vt.get(tenant) ?? 0;
      if (least === null || vt < least) least = vt;
    }
    return least;
  }

  /** `tenant` waits no more in `q`: its virtual time is kept only while it is ahead of the band. */
  private idle(q: BandQueue<T>, tenant: string): void {
    q.tenants.delete(tenant);
    if ((q.vt.get(tenant) ?? 0) <= q.now) q.vt.delete(tenant);
  }

  /**
   * Whom to shed for a new ticket `t`: the newest ticket of the lowest band that has any, at or
   * below `t`'s, of the tenant whose backlog ends furthest ahead of its share (its virtual time
   * and the tokens it has waiting: a flood's, not those of the tenants it crowds out). `t` itself
   * when that would be its own tenant, or nothing below or beside it waits.
   */
  private victim(t: T): T {
    const rank = BAND_ORDER.indexOf(t.band);
    for (let i = BAND_ORDER.length - 1; i >= rank; i--) {
      const q = this.band(BAND_ORDER[i] as Band);
      // Ties: the one already given more (its virtual time), then by name.
      let worst: string | null = null;
      let worstEnd = 0;
      let worstVt = 0;
      for (const [tenant, waiting] of q.tenants) {
        const vt = q.vt.get(tenant) ?? 0;
        const end = vt + waiting.reduce((n, w) => n + w.tokens, 0);
        const tie =
          end === worstEnd && (vt > worstVt || (vt === worstVt && tenant > (worst ?? '')));
        if (worst === null || end > worstEnd || tie) {
          worst = tenant;
          worstEnd = end;
          worstVt = vt;
        }
      }
      if (worst === null) continue;
      if (i > rank) return (q.tenants.get(worst) as T[]).at(-1) as T;
      // Its own band: the newcomer's tenant, were it taken, ends where?
      const own = q.tenants.get(t.tenant) ?? [];
      const ownEnd =
        (q.vt.get(t.tenant) ?? this.least(q) ?? q.now) +
        own.reduce((n, w) => n + w.tokens, 0) +
        t.tokens;
      return worst !== t.tenant && worstEnd > ownEnd
        ? ((q.tenants.get(worst) as T[]).at(-1) as T)
        : t;
    }
    return t;
  }
}
