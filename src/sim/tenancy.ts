/**
 * The simulator's checks of tenants and flow control (issue 69), each at every step of the run —
 * every committed event, every admission, every second of virtual time:
 *
 * - `tenant_within_limits`: a tenant never has more rooms live than its `maxConcurrency`, and the
 *   tokens of the requests taken from it in any window of a minute stay within what its
 *   tokens-per-minute bucket can have given (`tokensBound`).
 * - `fair_share`: within a band, each tenant that waited the whole of a 10 s window was taken at
 *   least 0.8 of an equal share of the tokens taken from those that did (`FAIR_SHARE`).
 * - `interactive_first`: no batch request is taken while an interactive one has waited longer than
 *   `BAND_BOUND_MS` (`interactiveFirst`).
 *
 * The time-to-live is `waits_within_ttl` (checks.ts).
 */
import type { JournalEvent } from '../room/events.ts';
import type { ClientOutcome } from './client.ts';
import type { Violation } from './invariants.ts';
import type { SimTenant } from './workload.ts';

/** The window of `fair_share`, and the least share of it a backlogged tenant gets. */
export const FAIR_WINDOW_MS = 10_000;
export const FAIR_SHARE = 0.8;
/**
 * A window is judged once an equal share of it is at least this many of the band's largest
 * requests: fair queueing by tokens keeps two backlogged tenants within one request of each other
 * (each side of the window), so below it a share is lumpy, not unfair.
 */
export const FAIR_MIN_REQUESTS = 10;
/**
 * How long an interactive request may have waited when a batch one is taken: one poll of flow
 * control. Interactive requests of tenants with limits of their own are passed over while their
 * limits hold them, by design, and are not counted.
 */
export const BAND_BOUND_MS = 50;

const TERMINAL = new Set(['room.completed', 'room.failed', 'room.aborted', 'room.migrated']);

/** Rooms at once and tokens a minute, each tenant against its own limits, event by event. */
export function tenantLimits(
  events: readonly JournalEvent[],
  tenants: ReadonlyMap<string, SimTenant>,
  /** The journal's head when each control plane after the first started. */
  starts: readonly number[],
): Violation[] {
  const out: Violation[] = [];
  // A control plane that starts has limits of its own, from nothing in flight: its predecessor's
  // live rooms are counted against none of it.
  let epoch = 0;
  const live = new Map<string, { tenant: string; epoch: number }>();
  const count = new Map<string, number>();
  for (const ev of events) {
    if (epochOf(starts, ev.seq) !== epoch) {
      epoch = epochOf(starts, ev.seq);
      count.clear();
    }
    if (ev.type === 'room.created' && ev.data.tenant !== undefined && ev.room !== null) {
      const tenant = ev.data.tenant;
      live.set(ev.room, { tenant, epoch });
      const n = (count.get(tenant) ?? 0) + 1;
      count.set(tenant, n);
      const max = tenants.get(tenant)?.maxConcurrency ?? null;
      if (max !== null && n > max && out.length < 10)
        out.push({
          invariant: 'tenant_within_limits',
          room: ev.room,
          seq: ev.seq,
          detail: `tenant ${tenant} had ${n} rooms live, its max concurrency ${max}`,
        });
    } else if (TERMINAL.has(ev.type) && ev.room !== null) {
      const was = live.get(ev.room);
      live.delete(ev.room);
      if (was && was.epoch === epoch) count.set(was.tenant, (count.get(was.tenant) ?? 1) - 1);
    }
  }
  for (const t of tenants.values())
    if (t.tokensPerMinute !== null)
      out.push(...tokensBound(events, t, starts).slice(0, 10 - out.length));
  return out;
}

/** Which control plane's life an event of `seq` falls in: 0 the first's. */
function epochOf(starts: readonly number[], seq: number): number {
  let n = 0;
  for (const head of starts) if (seq > head) n++;
  return n;
}

interface Taken {
  at: number;
  epoch: number;
  /** What it charged the bucket at most (prompt and `max_tokens`). */
  cost: number;
  prompt: number;
  /** Tokens streamed to it, as far as the journal tells: a migration's, then a completion's. */
  streamed: number;
  maxTokens: number;
  /** When its latest room ended (Infinity: not, in this trace), and that room. */
  endedAt: number;
  last: string;
}

/**
 * A tokens-per-minute bucket holds `cap` and refills `cap` a minute; a request is taken while it
 * holds one token, charged its prompt and `max_tokens`, and given back what it did not generate
 * when it ends. So what the requests taken in [a, b] used is at most: the bucket's fill at a
 * (`cap`), the refill until b, what requests in flight at a may still give back (their
 * `max_tokens`), and the last request's overdraft (the largest cost). Each request's use is
 * counted from below (its prompt, and the tokens a completed room or a migration recorded), so
 * the check never blames a tenant wrongly; windows within one control plane's life.
 */
function tokensBound(
  events: readonly JournalEvent[],
  t: SimTenant,
  starts: readonly number[],
): Violation[] {
  const cap = t.tokensPerMinute as number;
  const byRequest = new Map<string, Taken>();
  const ofRoom = new Map<string, Taken>();
  for (const ev of events) {
    if (ev.room === null) continue;
    if (ev.type === 'room.created' && ev.data.tenant === t.name) {
      const id = ev.data.requestId ?? ev.room;
      let r = byRequest.get(id);
      if (!r) {
        const prompt = ev.data.promptTokens ?? 0;
        r = {
          at: ev.ts,
          epoch: epochOf(starts, ev.seq),
          cost: prompt + (ev.data.maxTokens ?? 0),
          prompt,
          streamed: 0,
          maxTokens: ev.data.maxTokens ?? 0,
          endedAt: Number.POSITIVE_INFINITY,
          last: ev.room,
        };
        byRequest.set(id, r);
      }
      ofRoom.set(ev.room, r);
      // In flight until its latest room ends: a migration or a retry goes on in a new room.
      r.endedAt = Number.POSITIVE_INFINITY;
      r.last = ev.room;
    } else if (ofRoom.has(ev.room) && TERMINAL.has(ev.type)) {
      const r = ofRoom.get(ev.room) as Taken;
      if (r.last === ev.room && ev.type !== 'room.migrated') r.endedAt = ev.ts;
      // A migration records every token streamed so far; the room that completes, its own.
      if (ev.type === 'room.migrated') r.streamed = Math.max(r.streamed, ev.data.tokens ?? 0);
      else if (ev.type === 'room.completed') r.streamed += ev.data.tokens;
    }
  }
  const taken = [...byRequest.values()].sort((a, b) => a.at - b.at);
  const largest = Math.max(0, ...taken.map((r) => r.cost));
  const out: Violation[] = [];
  for (let i = 0; i < taken.length; i++) {
    const a = taken[i] as Taken;
    const inFlight = taken
      .slice(0, i)
      .filter((r) => r.endedAt > a.at)
      .reduce((n, r) => n + r.maxTokens, 0);
    let used = 0;
    for (let j = i; j < taken.length; j++) {
      const b = taken[j] as Taken;
      if (b.at - a.at > 60_000 || b.epoch !== a.epoch) break;
      used += b.prompt + b.streamed;
      const bound = cap + (cap * (b.at - a.at)) / 60_000 + inFlight + largest;
      if (used > bound)
        return [
          {
            invariant: 'tenant_within_limits',
            room: null,
            seq: 0,
            detail: `tenant ${t.name} used ${used} tokens in ${b.at - a.at} ms, more than its ${cap} tokens a minute allow (${Math.floor(bound)})`,
          },
        ];
    }
  }
  return out;
}

/** Each tenant's spans of waiting: from asking to being taken or refused, merged. */
function backlogs(outcomes: readonly ClientOutcome[]): Map<string, Array<[number, number]>> {
  const spans = new Map<string, Array<[number, number]>>();
  for (const o of outcomes) {
    if (o.askedAt === undefined || o.settledAt === undefined || o.settledAt <= o.askedAt) continue;
    const t = o.request.tenant ?? '';
    const list = spans.get(t) ?? [];
    list.push([o.askedAt, o.settledAt]);
    spans.set(t, list);
  }
  for (const [t, list] of spans) {
    list.sort((x, y) => x[0] - y[0]);
    const merged: Array<[number, number]> = [];
    for (const s of list) {
      const last = merged.at(-1);
      if (last && s[0] <= last[1]) last[1] = Math.max(last[1], s[1]);
      else merged.push([s[0], s[1]]);
    }
    spans.set(t, merged);
  }
  return spans;
}

const throughout = (spans: Array<[number, number]> | undefined, from: number, to: number) =>
  spans?.some(([a, b]) => a <= from && b >= to) ?? false;

const limited = (t: SimTenant | undefined) =>
  t !== undefined && (t.maxConcurrency !== null || t.tokensPerMinute !== null);

/**
 * In each band, over every 10 s window (a second apart), the tenants without limits of their own
 * that waited throughout it were each taken at least `FAIR_SHARE` of an equal share of the tokens
 * taken from them all. Returns the violations and how many windows were judged.
 */
export function fairShares(
  outcomes: readonly ClientOutcome[],
  tenants: ReadonlyMap<string, SimTenant>,
): { violations: Violation[]; judged: number } {
  const spans = backlogs(outcomes);
  const bandOf = (name: string) => tenants.get(name)?.band ?? 'interactive';
  const taken = outcomes.filter((o) => o.admittedAt !== undefined && o.cost !== undefined);
  if (taken.length === 0) return { violations: [], judged: 0 };
  const start = Math.min(...taken.map((o) => o.admittedAt as number));
  const end = Math.max(...taken.map((o) => o.admittedAt as number));
  const violations: Violation[] = [];
  let judged = 0;
  for (let from = start; from + FAIR_WINDOW_MS <= end; from += 1000) {
    const to = from + FAIR_WINDOW_MS;
    for (const band of ['interactive', 'batch']) {
      const waiting = [...spans.keys()].filter(
        (t) => bandOf(t) === band && !limited(tenants.get(t)) && throughout(spans.get(t), from, to),
      );
      if (waiting.length < 2) continue;
      const got = new Map(waiting.map((t) => [t, 0]));
      let largest = 0;
      for (const o of taken) {
        const t = o.request.tenant ?? '';
        if (bandOf(t) === band) largest = Math.max(largest, o.cost as number);
        const at = o.admittedAt as number;
        if (at >= from && at < to && got.has(t)) got.set(t, (got.get(t) ?? 0) + (o.cost as number));
      }
      const total = [...got.values()].reduce((a, b) => a + b, 0);
      const share = total / waiting.length;
      if (share < FAIR_MIN_REQUESTS * largest) continue;
      judged++;
      for (const [t, n] of got)
        if (n < FAIR_SHARE * share && violations.length < 10)
          violations.push({
            invariant: 'fair_share',
            room: null,
            seq: 0,
            detail: `tenant ${t || '(no key)'} waited from ${from} to ${to} and was taken ${n} tokens, under ${FAIR_SHARE} of an equal share of ${Math.round(share)} among ${waiting.join(', ')}`,
          });
    }
  }
  return { violations, judged };
}

/**
 * No batch request was taken while an interactive request (of a tenant without limits of its
 * own) had waited longer than `BAND_BOUND_MS`, and was still waiting.
 */
export function interactiveFirst(
  outcomes: readonly ClientOutcome[],
  tenants: ReadonlyMap<string, SimTenant>,
): Violation[] {
  const bandOf = (o: ClientOutcome) =>
    o.request.tenant === null
      ? 'interactive'
      : (tenants.get(o.request.tenant)?.band ?? 'interactive');
  const interactive = outcomes.filter(
    (o) =>
      bandOf(o) === 'interactive' &&
      !limited(o.request.tenant === null ? undefined : tenants.get(o.request.tenant)) &&
      o.askedAt !== undefined &&
      o.settledAt !== undefined,
  );
  const out: Violation[] = [];
  for (const b of outcomes) {
    if (bandOf(b) !== 'batch' || b.admittedAt === undefined) continue;
    const at = b.admittedAt;
    const held = interactive.find(
      (i) => (i.askedAt as number) <= at - BAND_BOUND_MS && (i.settledAt as number) > at,
    );
    if (held && out.length < 10)
      out.push({
        invariant: 'interactive_first',
        room: null,
        seq: 0,
        detail: `batch request ${b.request.id} was taken at ${at} while interactive ${held.request.id} had waited ${at - (held.askedAt as number)} ms`,
      });
  }
  return out;
}
