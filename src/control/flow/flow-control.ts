/**
 * Flow control in front of admission: a request that finds no engine with the pages free, no
 * engine of a role registered (one restarting), or its tenant at its own limit waits its turn
 * (tenants/flow.ts orders the waiting) instead of a blind refusal. It is tried again when a
 * commit may have freed something — a room ended, pages released, an engine registered — and
 * every 50 ms while anything waits (a tenant's bucket refills with time, not with commits).
 *
 * Refused, it gets the code of what held it (`overloaded`, `no_engines`, the tenant's limit), or
 * `queue_full` when the bound shed it; the error says how long it waited. `pdctl serve` and the
 * simulator's clients both come through here, so a seed reaches the same order as a real fleet.
 */
import type { Clock, Timer } from '../../ports/clock.ts';
import type { Band, Tenant } from '../../tenants/book.ts';
import {
  type Attempt,
  BAND_ORDER,
  FlowQueue,
  type FlowTicket,
  type WaitReason,
} from '../../tenants/flow.ts';
import { TenantLimits } from '../../tenants/limits.ts';
import { ControlError, type ControlErrorCode } from '../errors.ts';
import type { RoomStream } from '../intake/streams.ts';
import type { SubmitRequest } from '../options.ts';

export interface FlowOptions {
  /** Requests waiting at most; past it the lowest band is shed first. 0: none waits. */
  queueMax: number;
  /** How long a request of each band may wait; a client may ask for less, never more. */
  queueTtlMs: Record<Band, number>;
  /** How long a request waits while no engine of a role is registered (one restarting). */
  admissionWaitMs: number;
}

/** Flow control's defaults: how many wait, and how long each band waits at most. */
export const FLOW_DEFAULTS = {
  admissionWaitMs: 3000,
  queueMax: 1024,
  queueTtlMs: { interactive: 10_000, batch: 60_000 },
} as const satisfies FlowOptions;

/** A request as flow control takes it: a submit, its tenant whole, and its client's time-to-live. */
export interface FlowRequest extends Omit<SubmitRequest, 'tenant'> {
  tenant?: Tenant | null;
  /** The client's own time-to-live in the queue (`x-pdctl-queue-ttl-ms`): its band's at most. */
  ttlMs?: number;
}

/** One request taken after it waited: what the wait log journals (`request.waited`). */
export interface Waited {
  requestId: string | null;
  tenant: string | null;
  reason: WaitReason;
  waitedMs: number;
}

/** A refusal of flow control: a control-plane code, and when the client may try again. */
export class FlowRefusal extends ControlError {
  constructor(
    code: ControlErrorCode,
    message: string,
    readonly retryAfterS: number | null,
  ) {
    super(code, message);
  }
}

interface Ticket extends FlowTicket {
  request: FlowRequest;
  tenantOf: Tenant | null;
  resolve(s: RoomStream): void;
  reject(e: Error): void;
  /** Why the last try did not take it: the error the client gets if it waits no longer. */
  held: FlowRefusal | null;
  forget(): void;
}

export interface FlowDeps {
  clock: Clock;
  submit(request: SubmitRequest): RoomStream;
  /** The prompt's tokens (for its cost in its tenant's share), when the request has none. */
  tokenize(prompt: string): number[];
  /** A request taken after it waited (journaled by the API's wait log). */
  waited?(w: Waited): void;
}

/** How often waiting requests are tried again when no commit says something changed. */
const POLL_MS = 50;

const LIMIT_CODE = {
  tenant_concurrency_limit: 'CONTROL_TENANT_CONCURRENCY_LIMIT',
  tenant_token_limit: 'CONTROL_TENANT_TOKEN_LIMIT',
} as const;

export class FlowControl {
  /** Each tenant's own limits (rooms at once, tokens a minute), per process. */
  readonly limits = new TenantLimits();
  private readonly queue: FlowQueue<Ticket>;
  private timer: Timer | null = null;
  private timerAt = 0;
  /** Set once closing: what every request waiting, or coming later, is answered. */
  private closed: ControlError | null = null;
  /** What held each tenant at its last try, for its requests behind the one tried. */
  private readonly tenantHeld = new Map<string, FlowRefusal>();
  /** When the last interactive request came: batch keeps room for them until its TTL after. */
  private interactiveAt = Number.NEGATIVE_INFINITY;

  constructor(
    private readonly deps: FlowDeps,
    private readonly o: FlowOptions,
  ) {
    this.queue = new FlowQueue(o.queueMax);
  }

  /** Requests waiting now. */
  get waiting(): number {
    return this.queue.size;
  }

  /**
   * The request's room stream once it is taken, in its turn; rejects with a ControlError when it
   * cannot be served (at once) or waited out its time-to-live (a FlowRefusal).
   */
  admit(request: FlowRequest): Promise<RoomStream> {
    const { clock } = this.deps;
    const now = clock.now();
    const tenantOf = request.tenant ?? null;
    const band: Band = tenantOf?.band ?? 'interactive';
    if (band === 'interactive') this.interactiveAt = now;
    const ttl = Math.max(0, Math.min(this.o.queueTtlMs[band], request.ttlMs ?? Infinity));
    const tokens = request.tokens ?? this.deps.tokenize(request.prompt);
    return new Promise<RoomStream>((resolve, reject) => {
      const t: Ticket = {
        requestId: request.requestId ?? '',
        tenant: tenantOf?.name ?? '',
        band,
        tokens: tokens.length + request.maxTokens,
        enqueuedAt: now,
        deadline: now + ttl,
        waitingFor: null,
        request: { ...request, tokens },
        tenantOf,
        resolve,
        reject,
        held: null,
        forget: () => {},
      };
      if (this.closed) return reject(this.closed);
      // A client already gone (its signal fired before it got here) waits for nothing.
      if (request.signal?.aborted)
        return reject(new ControlError('CONTROL_CLOSED', 'the client left before its turn'));
      const shed = this.queue.push(t);
      if (shed === t) {
        // No place: shed, or with nothing waiting (a bound of 0) tried once and answered.
        if (this.queue.size > 0) return this.shed(t, now);
        const r = this.attempt(t);
        if (r.kind === 'tenant' || r.kind === 'fleet') this.refuse(t, now);
        return;
      }
      if (shed) this.shed(shed, now);
      const signal = request.signal;
      if (signal) {
        const left = () => {
          if (!this.queue.remove(t)) return;
          reject(new ControlError('CONTROL_CLOSED', 'the client left while its request waited'));
        };
        signal.addEventListener('abort', left, { once: true });
        t.forget = () => signal.removeEventListener('abort', left);
      }
      // Tried at the time it came in: one that may not wait is tried before it is answered.
      this.pump(now);
    });
  }

  /** Something may have freed room (a commit, a slot back): look again on the next turn. */
  wake(): void {
    if (this.queue.size > 0) this.schedule(this.deps.clock.now());
  }

  /** Refuses everything waiting, and all that comes later (the control plane is closing). */
  close(why = closedError()): void {
    this.closed ??= why;
    this.deps.clock.clear(this.timer);
    for (const t of [...this.queue.tickets()]) {
      this.queue.remove(t);
      t.forget();
      t.reject(this.closed);
    }
  }

  /** What waits now, per band: requests, their tokens, and how long the oldest has waited. */
  snapshot(
    now = this.deps.clock.now(),
  ): Record<Band, { requests: number; tokens: number; oldestMs: number }> {
    const out = Object.fromEntries(
      BAND_ORDER.map((b) => [b, { requests: 0, tokens: 0, oldestMs: 0 }]),
    ) as Record<Band, { requests: number; tokens: number; oldestMs: number }>;
    for (const t of this.queue.tickets()) {
      const b = out[t.band];
      b.requests++;
      b.tokens += t.tokens;
      b.oldestMs = Math.max(b.oldestMs, now - t.enqueuedAt);
    }
    return out;
  }

  /** What each waiting request will ask of the engines, for the planner. */
  demand(): Array<{ promptTokens: number; maxTokens: number }> {
    return [...this.queue.tickets()].map((t) => ({
      promptTokens: t.request.tokens?.length ?? 0,
      maxTokens: t.request.maxTokens,
    }));
  }

  private pump(now = this.deps.clock.now()): void {
    if (this.closed) return;
    // Past their time-to-live: answered, not tried. Then, in order, the rest.
    for (const t of this.queue.expire(now)) this.refuse(t, now);
    this.queue.pump((t) => this.attempt(t));
    // Those whose time is up now (0: it asked not to wait) had their try: answered now.
    for (const t of this.queue.expire(now + 1)) this.refuse(t, now);
    if (this.queue.size > 0)
      this.schedule(Math.min(now + POLL_MS, this.queue.nextDeadline() ?? Infinity));
  }

  private schedule(at: number): void {
    if (this.timer !== null && this.timerAt <= at) return;
    const { clock } = this.deps;
    clock.clear(this.timer);
    this.timerAt = at;
    this.timer = clock.setTimeout(
      () => {
        this.timer = null;
        this.pump();
      },
      Math.max(0, at - clock.now()),
    );
    this.timer.unref();
  }

  /** Tries `t` once: its tenant's limits, then the fleet. */
  private attempt(t: Ticket): Attempt {
    const now = this.deps.clock.now();
    const tenant = t.tenantOf;
    if (tenant) {
      const v = this.limits.admit(tenant, now);
      if (!v.ok) {
        const reason =
          v.limit === 'concurrency' ? 'tenant_concurrency_limit' : 'tenant_token_limit';
        t.held = new FlowRefusal(LIMIT_CODE[reason], v.message, v.retryAfterS);
        this.tenantHeld.set(tenant.name, t.held);
        return { kind: 'tenant', reason };
      }
      this.tenantHeld.delete(tenant.name);
    }
    let stream: RoomStream;
    const waitedMs = now - t.enqueuedAt;
    try {
      stream = this.deps.submit({
        ...submitOf(t.request),
        ...(tenant ? { tenant: { name: tenant.name, band: tenant.band } } : {}),
        ...(waitedMs > 0 ? { waitedMs } : {}),
        // While interactive requests come, a batch one leaves room for the next of them: one
        // arriving finds a slot, not a fleet the batch band filled.
        ...(t.band === 'batch' && now - this.interactiveAt <= this.o.queueTtlMs.interactive
          ? { headroom: true }
          : {}),
      });
    } catch (err) {
      if (tenant) this.limits.release(tenant, 0, now);
      const code = err instanceof ControlError ? err.code : null;
      if (
        code === 'CONTROL_OVERLOADED' ||
        (code === 'CONTROL_NO_ENGINES' && this.o.admissionWaitMs > 0)
      ) {
        const reason = code === 'CONTROL_OVERLOADED' ? 'overloaded' : 'no_engines';
        t.held = new FlowRefusal(code, (err as Error).message, null);
        // An engine restart takes about 2 s: past --admission-wait-ms, none is coming.
        if (reason === 'no_engines')
          t.deadline = Math.min(t.deadline, t.enqueuedAt + this.o.admissionWaitMs);
        return { kind: 'fleet', reason };
      }
      t.forget();
      t.reject(err as Error);
      return { kind: 'failed' };
    }
    if (tenant) {
      // Its tokens come out of the tenant's minute now; what it did not generate goes back.
      const maxTokens = t.request.maxTokens;
      this.limits.charge(tenant, stream.promptTokens + maxTokens, now);
      const release = () => {
        this.limits.release(tenant, Math.max(0, maxTokens - stream.tokens), this.deps.clock.now());
        this.wake();
      };
      stream.result.then(release, release);
    }
    if (waitedMs > 0)
      this.deps.waited?.({
        requestId: t.request.requestId ?? null,
        tenant: tenant?.name ?? null,
        reason: t.waitingFor ?? 'overloaded',
        waitedMs,
      });
    t.forget();
    t.resolve(stream);
    return { kind: 'admitted' };
  }

  /**
   * `t` waited out its time-to-live: it gets what held it, and the wait it was allowed (it waited
   * that long, give or take a timer's turn).
   */
  private refuse(t: Ticket, now: number): void {
    t.forget();
    const allowed = t.deadline - t.enqueuedAt;
    const ofTenant = t.waitingFor?.startsWith('tenant_') ? this.tenantHeld.get(t.tenant) : null;
    const held =
      t.held ??
      ofTenant ??
      new FlowRefusal('CONTROL_OVERLOADED', `${this.queue.size} requests wait ahead of it`, null);
    const message =
      allowed <= 0 || now < t.deadline
        ? held.message
        : held.code === 'CONTROL_NO_ENGINES'
          ? `${held.message} (waited ${allowed} ms for one)`
          : `${held.message} (waited ${allowed} ms in the ${t.band} queue, its time-to-live)`;
    t.reject(new FlowRefusal(held.code, message, held.retryAfterS));
  }

  /** `t` was shed at the queue's bound. */
  private shed(t: Ticket, now: number): void {
    t.forget();
    const waited = now - t.enqueuedAt;
    t.reject(
      new FlowRefusal(
        'CONTROL_QUEUE_FULL',
        `${this.o.queueMax} requests wait to be served, the most this control plane holds; the ${t.band} band is shed ${t.band === 'batch' ? 'first' : 'once no batch request is left to shed'}${waited > 0 ? ` (this one waited ${waited} ms)` : ''}`,
        1,
      ),
    );
  }
}

/** The submit a flow request is, without what only flow control reads. */
function submitOf(r: FlowRequest): Omit<SubmitRequest, 'tenant'> {
  const { tenant, ttlMs, ...submit } = r;
  return submit;
}

function closedError(): ControlError {
  return new ControlError('CONTROL_CLOSED', 'the control plane is shutting down');
}
