/**
 * One seed of the simulator (issue 41, items 3 and 4): a fleet, a seeded workload played against
 * it by simulated clients, then the checks — the journal's safety and liveness invariants, every
 * client's text against the reference model's, and nothing left in flight — and a hash of the
 * trace the run committed, which is the same every time the seed runs.
 */
import { createHash } from 'node:crypto';
import { ControlError } from '../control/errors.ts';
import type { RoomStream } from '../control/streams.ts';
import type { JournalEvent } from '../journal/events.ts';
import { type Logger, silentLogger } from '../log.ts';
import { DeterministicModel, generateInProcess } from '../model/deterministic.ts';
import {
  type FaultKind,
  type PlannedFault,
  planFaults,
  scheduleFaults,
  touched,
} from './faults.ts';
import { Fleet, type FleetOptions } from './fleet.ts';
import { liveness, safety, type Violation } from './invariants.ts';
import { type ClientRequest, type WorkloadOptions, workload } from './workload.ts';

export interface SeedOptions {
  seed: number;
  /** Requests of the workload. Default 200. */
  rooms?: number;
  workload?: Partial<WorkloadOptions>;
  fleet?: Omit<FleetOptions, 'seed' | 'log'>;
  log?: Logger;
  /** Return the committed events with the report (to write the trace of a failing seed). */
  keepTrace?: boolean;
  /** The kinds of fault the seed draws its faults from (faults.ts). Default: none. */
  faults?: readonly FaultKind[];
}

/** What one client saw. */
export interface ClientOutcome {
  request: ClientRequest;
  text: string;
  error: string | null;
  finishReason: string | null;
  /** A chunk that reached the client while its room's KV transfer was not committed: which state. */
  early?: string;
  /** The control plane took the request (it got a room); false: refused at once. */
  admitted?: boolean;
}

export interface SeedReport {
  seed: number;
  rooms: number;
  /** Clients answered whole, ended by their own abort or disconnect, and failed. */
  completed: number;
  ended: number;
  failed: number;
  events: number;
  virtualMs: number;
  wallMs: number;
  /** SHA-256 of the committed trace (every event, in seq order). */
  traceHash: string;
  violations: Violation[];
  /** The committed events, with `keepTrace`. */
  trace?: readonly JournalEvent[];
  /** The faults the seed injected. */
  faults: PlannedFault[];
  /** Why clients failed: each error message (its first 120 characters) and how many got it. */
  errors: Record<string, number>;
}

/** How long after the last client the run goes on, for releases and the watchdog's deadlines. */
const SETTLE_MS = 10_000;

export async function runSeed(options: SeedOptions): Promise<SeedReport> {
  const wallStart = performance.now();
  const fleet = await Fleet.start({
    ...options.fleet,
    seed: options.seed,
    ...(options.log ? { log: options.log } : {}),
  });
  const { clock } = fleet;
  const requests = workload(fleet.random.fork('workload'), {
    ...options.workload,
    requests: options.rooms ?? options.workload?.requests ?? 200,
  });
  const start = clock.now();
  const span = requests.at(-1)?.at ?? 0;
  const engines = {
    prefill: [...fleet.engines.values()].filter((e) => e.role === 'prefill').map((e) => e.id),
    decode: [...fleet.engines.values()].filter((e) => e.role === 'decode').map((e) => e.id),
  };
  const faults = planFaults(fleet.random.fork('faults'), options.faults ?? [], engines, span);
  scheduleFaults(fleet, faults);
  const book: Violation[] = [];
  watchBook(fleet, book);
  const clients = requests.map(
    (request) =>
      new Promise<ClientOutcome>((resolve) => {
        clock.setTimeout(() => void client(fleet, request).then(resolve), request.at);
      }),
  );
  const outcomes = await clock.runUntil(Promise.all(clients), 3_600_000);
  const healed = Math.max(0, ...faults.map((f) => start + f.at + f.forMs - clock.now()));
  await clock.run(healed + SETTLE_MS);
  // Every fault is healed by now. An operator does what the runbook says for an engine the ladder
  // cordoned (docs/alerts.md, PdctlEngineCordoned): takes it back once its fault is fixed.
  await clock.runUntil(uncordonAll(fleet), 60_000);
  // The fleet must serve new requests, whole.
  const after = await clock.runUntil(
    Promise.all(AFTER_HEAL.map((request) => client(fleet, request))),
    60_000,
  );
  await clock.run(SETTLE_MS);
  const events = fleet.disk.events;
  const violations = [
    ...safety(events),
    ...liveness(events, (room) => fleet.disk.rooms.get(room)?.state),
    ...answers(outcomes),
    ...answers(after),
    ...spared(
      events,
      touched(faults),
      faults.length > 0,
      faults.every((f) => f.kind === 'kill'),
      outcomes,
    ),
    ...book,
    ...fleet.controlStartFailures.map((why) => ({
      invariant: 'control_plane_starts',
      room: null,
      seq: 0,
      detail: `a control plane did not start on the journal its predecessor left: ${why}`,
    })),
    ...after
      .filter((o) => o.error !== null)
      .map((o) => ({
        invariant: 'served_after_heal',
        room: null,
        seq: 0,
        detail: `${o.request.id} failed once every fault was healed: ${o.error}`,
      })),
  ];
  const virtualMs = clock.now() - start;
  try {
    await fleet.stop();
  } catch (err) {
    violations.push({
      invariant: 'fleet_stops',
      room: null,
      seq: 0,
      detail: `the engines and control plane did not stop: ${(err as Error).message}`,
    });
  }
  const count = (f: (o: ClientOutcome) => boolean) => outcomes.filter(f).length;
  return {
    seed: options.seed,
    rooms: requests.length,
    completed: count((o) => o.error === null && o.request.action === null),
    ended: count((o) => o.request.action !== null),
    failed: count((o) => o.error !== null && o.request.action === null),
    events: events.length,
    virtualMs,
    wallMs: performance.now() - wallStart,
    traceHash: traceHash(events),
    violations,
    ...(options.keepTrace ? { trace: events } : {}),
    faults,
    errors: tally(outcomes.filter((o) => o.error !== null && o.request.action === null)),
  };
}

/** `pdctl engines uncordon ID` for every cordoned engine. */
async function uncordonAll(fleet: Fleet): Promise<void> {
  const { control, journal } = fleet;
  const cordons = control.registry.cordons;
  for (const engine of [...cordons.all().keys()])
    await cordons.uncordon(
      { journal, log: silentLogger, control },
      engine,
      'the simulated operator, once every fault healed',
    );
}

function tally(failed: readonly ClientOutcome[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const o of failed) {
    const key = (o.error ?? '').slice(0, 120);
    out[key] = (out[key] ?? 0) + 1;
  }
  return out;
}

/** A client: submits, reads its answer (streamed or whole), and aborts or leaves if it is one that does. */
async function client(fleet: Fleet, request: ClientRequest): Promise<ClientOutcome> {
  const outcome: ClientOutcome = { request, text: '', error: null, finishReason: null };
  const leave = new AbortController();
  let stream: RoomStream;
  // As the API does for a completion (api/openai.ts `admitted`): while no engine of a role is
  // there (one is restarting), ask again every 50 ms for up to 3 s.
  const giveUpAt = fleet.clock.now() + 3000;
  let died: Promise<void>;
  for (;;) {
    if (!(await reach(fleet))) {
      outcome.error = 'the control plane is down: connection refused';
      return outcome;
    }
    died = fleet.controlDied;
    try {
      stream = fleet.control.submit({
        prompt: request.prompt,
        maxTokens: request.maxTokens,
        signal: leave.signal,
        requestId: request.id,
      });
      outcome.admitted = true;
      break;
    } catch (err) {
      const noEngine = err instanceof ControlError && err.code === 'CONTROL_NO_ENGINES';
      if (!noEngine || fleet.clock.now() >= giveUpAt) {
        outcome.error = (err as Error).message;
        return outcome;
      }
      await new Promise<void>((r) => fleet.clock.setTimeout(r, 50));
    }
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
    if (request.stream)
      for await (const c of stream) {
        outcome.text += c.text;
        // No virtual time passes between the chunk's relay and this read (the clock moves only
        // between timers): the journal is as it was when the control plane relayed it.
        const state = fleet.disk.rooms.get(stream.current)?.state ?? 'not created';
        if (BEFORE_KV.has(state)) outcome.early ??= `${stream.current} ${state}`;
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

/**
 * The control plane's room book against the journal's own fold (the in-memory disk's), after every
 * commit: a commit is published to every subscriber in one go — the control plane first, this
 * check after — so once that is done, every room the commit touched that the book still shows must
 * be as the journal has it, whole (the reducer's every field).
 */
export function watchBook(fleet: Fleet, out: Violation[]): void {
  const touched = new Set<string>();
  const check = () => {
    for (const id of touched) {
      const shown = fleet.control.room(id);
      if (shown === undefined || out.length >= 10) continue;
      const a = JSON.stringify(shown);
      const b = JSON.stringify(fleet.disk.rooms.get(id) ?? null);
      if (a !== b)
        out.push({
          invariant: 'book_equals_journal',
          room: id,
          seq: 0,
          detail: `at ${fleet.clock.monotonic()} ms the control plane shows ${a.slice(0, 300)}; the journal folds ${b.slice(0, 300)}`,
        });
    }
    touched.clear();
  };
  const watch = () =>
    fleet.journal.subscribe(fleet.disk.headSeq(), (ev) => {
      if (ev.room === null) return;
      if (touched.size === 0) queueMicrotask(check);
      touched.add(ev.room);
    });
  watch();
  // A restarted control plane has a journal of its own, opened on the same disk.
  fleet.onControlStarted(watch);
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

/** The requests sent once the run settled, every fault healed. */
const AFTER_HEAL: readonly ClientRequest[] = Array.from({ length: 4 }, (_, i) => ({
  id: `after-heal-${i}`,
  at: 0,
  prompt: `the fleet after every fault is healed answers request ${i}`,
  prefix: null,
  maxTokens: 8,
  stream: i % 2 === 0,
  action: null,
}));

/** What the journal says was done to an engine that was at fault: none may name an untouched one. */
const BLAMED = new Set(['engine.exited', 'engine.lost', 'engine.stalled', 'engine.cordoned']);

/**
 * The engines no fault touched: started once, never exited, stalled, lost or cordoned. And with
 * no fault at all, no client whose request failed.
 */
function spared(
  events: readonly JournalEvent[],
  hit: ReadonlySet<string>,
  anyFault: boolean,
  onlyKills: boolean,
  outcomes: readonly ClientOutcome[],
): Violation[] {
  const out: Violation[] = [];
  const starts = new Map<string, Set<string>>();
  // The ladder restarts every engine when two or more stalled within a minute (the fault is
  // likelier in what they share): the untouched ones' restarts are then by design — but only
  // when the engines that stalled were ones the faults hit.
  const stalledHit = new Set(
    events
      .filter((e) => e.type === 'engine.stalled' && hit.has(e.engine ?? ''))
      .map((e) => e.engine),
  );
  let stackRestarted = false;
  for (const ev of events) {
    if (ev.type === 'recovery.action' && ev.data.action === 'restart_stack')
      stackRestarted ||= stalledHit.size >= 2;
    if (ev.engine === null || hit.has(ev.engine)) continue;
    const restarted =
      stackRestarted &&
      (ev.type === 'engine.registered' || (ev.type === 'engine.exited' && ev.data.expected));
    if (restarted) continue;
    // A restarted control plane registers the same incarnation again: only new ones count.
    if (ev.type === 'engine.registered')
      starts.set(ev.engine, (starts.get(ev.engine) ?? new Set()).add(ev.data.incarnation));
    if (BLAMED.has(ev.type))
      out.push({
        invariant: 'untouched_engine_spared',
        room: null,
        seq: ev.seq,
        detail: `${ev.type} ${ev.engine} (${JSON.stringify(ev.data).slice(0, 200)}), though no fault hit it`,
      });
  }
  for (const [engine, incarnations] of starts)
    if (incarnations.size > 1)
      out.push({
        invariant: 'untouched_engine_spared',
        room: null,
        seq: 0,
        detail: `${engine} registered ${incarnations.size} incarnations, though no fault hit it`,
      });
  // A killed engine's rooms move at once, and it comes back: with no other fault, no client that
  // got a room fails, and no room waits out a deadline. (A request that came while every engine
  // of a role was down is refused: that is no defect.)
  if (!anyFault)
    for (const o of outcomes)
      if (o.error !== null && o.request.action === null)
        out.push({
          invariant: 'no_failure_without_fault',
          room: null,
          seq: 0,
          detail: `${o.request.id}: ${o.error}`,
        });
  if (anyFault && onlyKills) {
    for (const o of outcomes)
      if (o.error !== null && o.request.action === null && o.admitted)
        out.push({
          invariant: 'kill_loses_no_stream',
          room: null,
          seq: 0,
          detail: `${o.request.id}: ${o.error}`,
        });
    for (const ev of events)
      if (ev.type === 'room.failed' && ev.data.reason === 'deadline_exceeded')
        out.push({
          invariant: 'kill_leaves_no_room_waiting',
          room: ev.room,
          seq: ev.seq,
          detail: `failed deadline_exceeded in ${ev.data.stage}`,
        });
  }
  return out;
}

const reference = new DeterministicModel();

/**
 * Every client's text against the reference model's for its request: whole when answered, a
 * prefix of it when the client left or the room ended early (no token duplicated, missing, or
 * from another room).
 */
export function answers(outcomes: readonly ClientOutcome[]): Violation[] {
  const out: Violation[] = [];
  for (const o of outcomes) {
    if (o.early)
      out.push({
        invariant: 'streamed_only_committed',
        room: null,
        seq: 0,
        detail: `${o.request.id} was sent tokens of room ${o.early}: before its KV transfer was committed`,
      });
    const want = generateInProcess(reference, o.request.prompt, o.request.maxTokens).text;
    const whole = o.error === null && o.request.action === null;
    const ok = whole ? o.text === want : want.startsWith(o.text);
    if (!ok)
      out.push({
        invariant: whole ? 'answer_is_the_models' : 'answer_is_a_prefix_of_the_models',
        room: null,
        seq: 0,
        detail: `${o.request.id}: got ${JSON.stringify(o.text.slice(0, 80))}, the model says ${JSON.stringify(want.slice(0, 80))}`,
      });
  }
  return out;
}

function traceHash(events: readonly JournalEvent[]): string {
  const h = createHash('sha256');
  for (const e of events) h.update(`${JSON.stringify(e)}\n`);
  return h.digest('hex');
}
