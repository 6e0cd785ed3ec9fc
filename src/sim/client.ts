/**
 * A simulated client of the control plane (issue 41, item 3): it submits as the API does, through
 * flow control (waiting its turn while no engine has room or none is there), reads its answer
 * streamed or whole, aborts or leaves if it is one that does, and loses its connection when the
 * control plane's process dies.
 */
import { ControlError } from '../control/errors.ts';
import type { RoomStream } from '../control/intake/streams.ts';
import type { Tenant } from '../tenants/book.ts';
import type { Fleet } from './fleet.ts';
import type { ClientRequest, SimTenant } from './workload.ts';

/** What one client saw. */
export interface ClientOutcome {
  request: ClientRequest;
  text: string;
  error: string | null;
  finishReason: string | null;
  /**
   * A chunk that reached the client while its room's KV transfer was not committed, other than
   * the room's first token (chunk 0, one token, from the prefill engine its committed
   * `room.created` names: protocol 9), or a first token read twice: which room, in which state.
   */
  early?: string;
  /** The control plane took the request (it got a room); false: refused at once. */
  admitted?: boolean;
  /** When it asked, when flow control took it, and when it was taken or refused (virtual unix ms). */
  askedAt?: number;
  admittedAt?: number;
  settledAt?: number;
  /** What it cost of its tenant's share when taken: prompt tokens and `max_tokens`. */
  cost?: number;
  /** The control plane's code for a refusal (`CONTROL_TENANT_TOKEN_LIMIT`, …). */
  code?: string;
}

/** A client: submits, reads its answer (streamed or whole), and aborts or leaves if it is one that does. */
export async function client(
  fleet: Fleet,
  request: ClientRequest,
  tenants: ReadonlyMap<string, SimTenant> = new Map(),
): Promise<ClientOutcome> {
  const outcome: ClientOutcome = { request, text: '', error: null, finishReason: null };
  const leave = new AbortController();
  let stream: RoomStream;
  if (!(await reach(fleet))) {
    outcome.error = 'the control plane is down: connection refused';
    return outcome;
  }
  const died = fleet.controlDied;
  // As the API does for a completion (api/app.ts): through flow control, which holds it while
  // no engine has the pages free or none of a role is there (one restarting: 3 s at most).
  const tenant = request.tenant === null ? undefined : tenants.get(request.tenant);
  outcome.askedAt = fleet.clock.now();
  try {
    const admitted = fleet.flow.admit({
      prompt: request.prompt,
      maxTokens: request.maxTokens,
      signal: leave.signal,
      requestId: request.id,
      ...(tenant ? { tenant: tenantOf(tenant) } : {}),
    });
    admitted.catch(() => {});
    stream = await Promise.race([
      admitted,
      died.then(() => {
        throw new Error('the control plane died: connection reset');
      }),
    ]);
    outcome.admitted = true;
    outcome.admittedAt = fleet.clock.now();
    outcome.settledAt = outcome.admittedAt;
    outcome.cost = stream.promptTokens + request.maxTokens;
  } catch (err) {
    outcome.error = (err as Error).message;
    outcome.settledAt = fleet.clock.now();
    if (err instanceof ControlError) outcome.code = err.code;
    return outcome;
  }
  const act = request.action;
  if (act) {
    fleet.clock.setTimeout(
      () =>
        fleet.inControl(() => {
          if (act.kind === 'disconnect') leave.abort();
          else void fleet.control.abort(stream.current, 'client_abort', 'api').catch(() => {});
        }),
      act.afterMs,
    );
  }
  const read = async () => {
    const firsts = new Set<string>();
    if (request.stream)
      for await (const c of stream) {
        outcome.text += c.text;
        // No virtual time passes between the chunk's relay and this read (the clock moves only
        // between timers): the journal is as it was when the control plane relayed it.
        const state = fleet.disk.rooms.get(c.room)?.state ?? 'not created';
        const first = c.index === 0 && c.tokens === 1 && state !== 'not created';
        if (BEFORE_KV.has(state) && !first) outcome.early ??= `${c.room} ${state}`;
        if (c.index === 0 && firsts.has(c.room)) outcome.early ??= `${c.room} ${state} (twice)`;
        firsts.add(c.room);
      }
    const result = await stream.result;
    if (!request.stream) outcome.text = result.text;
    outcome.finishReason = result.finishReason;
  };
  try {
    // The control plane's process dying resets the client's connection: it reads no more.
    const reading = read();
    reading.catch(() => {});
    await Promise.race([
      reading,
      died.then(() => {
        throw new Error('the control plane died: connection reset');
      }),
    ]);
  } catch (err) {
    outcome.error = (err as Error).message;
  }
  return outcome;
}

/** A refusal by flow control working as meant: the tenant's own limit, or shed from a full queue. */
export function isLimit(code: string | undefined): boolean {
  return (
    code === 'CONTROL_TENANT_CONCURRENCY_LIMIT' ||
    code === 'CONTROL_TENANT_TOKEN_LIMIT' ||
    code === 'CONTROL_QUEUE_FULL'
  );
}

/** The tenant as the control plane's book holds it (`pdctl tenants add`). */
function tenantOf(t: SimTenant): Tenant {
  return { ...t, keyId: '00000000', addedAt: 0, rotatedAt: null, revokedAt: null };
}

/**
 * Waits until the control plane's process runs (a stopped one takes a request when it goes on):
 * false when it is down, or dies meanwhile (the client's connection is refused or reset).
 */
function reach(fleet: Fleet): Promise<boolean> {
  if (!fleet.controlUp) return Promise.resolve(false);
  return Promise.race([
    new Promise<boolean>((r) => fleet.inControl(() => r(true))),
    fleet.controlDied.then(() => false),
  ]);
}

/** States of a room before its KV transfer committed: nothing may reach its client then. */
const BEFORE_KV = new Set([
  'not created',
  'created',
  'bootstrapping',
  'waiting_for_input',
  'prefilling',
  'transferring',
]);
