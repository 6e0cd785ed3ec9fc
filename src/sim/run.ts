/**
 * One seed of the simulator (issue 41, items 3 and 4): a fleet, a seeded workload played against
 * it by simulated clients, then the checks — the journal's safety and liveness invariants, every
 * client's text against the reference model's, and nothing left in flight — and a hash of the
 * trace the run committed, which is the same every time the seed runs.
 */
import { createHash } from 'node:crypto';
import type { LeaderTerm } from '../journal/store.ts';
import { type Logger, silentLogger } from '../log.ts';
import type { Random } from '../ports/random.ts';
import type { JournalEvent } from '../room/events.ts';
import {
  answers,
  liarsOut,
  roleKeptInRotation,
  spared,
  waitsWithinTtl,
  watchControl,
  withinDeadlines,
} from './checks.ts';
import { type ClientOutcome, client, isLimit } from './client.ts';
import {
  type FaultKind,
  type PlannedFault,
  type PlanShape,
  planFaults,
  scheduleFaults,
  touched,
} from './faults.ts';
import { Fleet, type FleetOptions } from './fleet.ts';
import { liveness, safety, type Violation } from './invariants.ts';
import { fairShares, interactiveFirst, tenantLimits } from './tenancy.ts';
import {
  type ClientRequest,
  DEFAULT_WORKLOAD,
  drawTenants,
  FLOOD_TENANT,
  flood,
  type SimTenant,
  type WorkloadOptions,
  workload,
} from './workload.ts';

/** How much faster than the workload a `flood` fault's tenant sends. */
const FLOOD_FACTOR = 4;

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
  /** When faults start and what they hit (faults.ts `PlanShape`). Default `early`. */
  plan?: PlanShape;
}

export interface SeedReport {
  seed: number;
  rooms: number;
  /**
   * Clients answered whole, ended by their own abort or disconnect, refused by their tenant's own
   * limits or shed from a full queue (flow control working as meant), and failed.
   */
  completed: number;
  ended: number;
  limited: number;
  failed: number;
  /** The seed's tenants (a `flood` fault's among them); none: an open API. */
  tenants: SimTenant[];
  /** Windows `fair_share` judged (tenancy.ts): 10 s in which two tenants of a band both waited. */
  fairWindows: number;
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
  /** With a standby: every term of the journal's leadership, oldest first (a takeover each after the first). */
  leaders: LeaderTerm[];
  /** With a standby: the hosts whose control plane woke deposed and exited, in order. */
  deposed: string[];
  /** Why clients failed: each error message (its first 120 characters) and how many got it. */
  errors: Record<string, number>;
}

/**
 * A `whole` plan's workload when none is given: 200 requests four seeds in five, else 500 to
 * 2,000 — long enough for late faults to land while rooms still arrive.
 */
function drawnLength(random: Random): number {
  return random.next() < 0.8 ? 200 : random.between(500, 2000);
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
  const tenants = options.workload?.tenants ?? drawTenants(fleet.random.fork('tenants'));
  const requests = workload(fleet.random.fork('workload'), {
    ...options.workload,
    tenants,
    requests:
      options.rooms ??
      options.workload?.requests ??
      (options.plan === 'whole' ? drawnLength(fleet.random.fork('length')) : 200),
  });
  const start = clock.now();
  const span = requests.at(-1)?.at ?? 0;
  const engines = {
    prefill: [...fleet.engines.values()].filter((e) => e.role === 'prefill').map((e) => e.id),
    decode: [...fleet.engines.values()].filter((e) => e.role === 'decode').map((e) => e.id),
  };
  const faults = planFaults(
    fleet.random.fork('faults'),
    options.faults ?? [],
    engines,
    span,
    options.plan,
  );
  scheduleFaults(fleet, faults);
  const floods = faults.filter((f) => f.kind === 'flood');
  for (const [i, f] of floods.entries())
    requests.push(
      ...flood(
        fleet.random.fork(`flood-${i}`),
        {
          at: f.at,
          forMs: f.forMs,
          perSecond: (options.workload?.perSecond ?? DEFAULT_WORKLOAD.perSecond) * FLOOD_FACTOR,
          first: requests.length,
        },
        options.workload,
      ),
    );
  const roster = new Map<string, SimTenant>(
    [...tenants, ...(floods.length > 0 ? [FLOOD_TENANT] : [])].map((t) => [t.name, t]),
  );
  const book: Violation[] = [];
  watchControl(fleet, book);
  // The journal's head as each control plane after the first starts: its limits start afresh.
  const starts: number[] = [];
  fleet.onControlStarted(() => starts.push(fleet.disk.headSeq()));
  const clients = requests.map(
    (request) =>
      new Promise<ClientOutcome>((resolve) => {
        clock.setTimeout(() => void client(fleet, request, roster).then(resolve), request.at);
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
  // The background canary stops first, and the outlier detector's probes of ejected engines with
  // it: a room of their own started as the run ends would be in flight when every room must have
  // ended (seed 1873 of `all`: a probe's room created at the last tick).
  fleet.outliers.stop();
  await clock.runUntil(fleet.canary.stop(), 60_000);
  await clock.run(SETTLE_MS);
  const events = fleet.disk.events;
  const fair = fairShares(outcomes, roster);
  // With the SQLite journal: every committed room reads back, from the journal or the archive.
  const stored = fleet.storage ? await fleet.storage.check(fleet.journal) : [];
  const violations = [
    ...safety(events),
    ...liveness(events, (room) => fleet.disk.rooms.get(room)?.state),
    ...answers(outcomes),
    ...answers(after),
    ...withinDeadlines(events, excusedWindows(faults, start)),
    ...waitsWithinTtl(events),
    ...tenantLimits(events, roster, starts),
    ...fair.violations,
    ...interactiveFirst(outcomes, roster),
    ...spared(
      events,
      touched(faults),
      faults.length > 0,
      // Kills and retirements move rooms and lose no stream.
      faults.every((f) => f.kind === 'kill' || f.kind === 'retire'),
      outcomes,
    ),
    ...liarsOut(events, faults, fleet.lied, (e) => fleet.engines.get(e)?.role),
    ...roleKeptInRotation(events),
    ...book,
    ...stored,
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
    limited: count((o) => o.request.action === null && isLimit(o.code)),
    failed: count((o) => o.error !== null && o.request.action === null && !isLimit(o.code)),
    tenants: [...roster.values()],
    fairWindows: fair.judged,
    events: events.length,
    virtualMs,
    wallMs: performance.now() - wallStart,
    traceHash: traceHash(events),
    violations,
    ...(options.keepTrace ? { trace: events } : {}),
    faults,
    leaders: fleet.disk.leadership.terms.map((t) => ({ ...t })),
    deposed: [...fleet.deposed],
    errors: tally(
      outcomes.filter((o) => o.error !== null && o.request.action === null && !isLimit(o.code)),
    ),
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

/** The requests sent once the run settled, every fault healed. */
const AFTER_HEAL: readonly ClientRequest[] = Array.from({ length: 4 }, (_, i) => ({
  id: `after-heal-${i}`,
  at: 0,
  prompt: `the fleet after every fault is healed answers request ${i}`,
  prefix: null,
  maxTokens: 8,
  stream: i % 2 === 0,
  action: null,
  tenant: null,
}));

function traceHash(events: readonly JournalEvent[]): string {
  const h = createHash('sha256');
  for (const e of events) h.update(`${JSON.stringify(e)}\n`);
  return h.digest('hex');
}

/**
 * When nothing could fail an overdue room, so no deadline holds: the journal refusing writes, the
 * control plane stopped or dead — each until a second after it ends (the watchdog's next ticks).
 */
function excusedWindows(
  faults: readonly PlannedFault[],
  start: number,
): Array<{ from: number; to: number }> {
  return faults
    .filter(
      (f) => f.kind === 'disk-full' || f.kind === 'control-freeze' || f.kind === 'control-kill',
    )
    .map((f) => ({ from: start + f.at, to: start + f.at + f.forMs + 1000 }));
}
