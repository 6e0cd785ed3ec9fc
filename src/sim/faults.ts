/**
 * Seeded faults (issue 41, item 3): which faults a run injects, into what, when and for how long,
 * drawn from the seed; each one healed before the run settles, so that liveness can be checked
 * after. What each does to the fleet is the adapters' (fleet.ts and world/: network.ts,
 * journal.ts, transfer-core.ts).
 */
import type { Random } from '../ports/random.ts';
import { type Fleet, LIE_SHAPES, type LieShape } from './fleet.ts';

export const FAULT_KINDS = [
  /** The link between the control plane and an engine is down (a cut cable, a dead switch port). */
  'partition',
  /** An engine's process is SIGKILLed; its supervisor starts it again when the fault ends. */
  'kill',
  /** An engine's process is SIGSTOPped, then SIGCONTed. */
  'freeze',
  /** The journal refuses writes (a full disk), then takes them again. */
  'disk-full',
  /** A prefill engine's transfers make no progress. */
  'transfer-stall',
  /** A prefill engine's transfers arrive with a byte flipped. */
  'transfer-corrupt',
  /** The control plane's process is SIGSTOPped, then SIGCONTed (with its embedded journal). */
  'control-freeze',
  /**
   * An engine that hangs whenever it runs (a faulty device): SIGSTOPped, and again a second after
   * each restart, until the fault ends — the relapse the ladder must cordon, not the fleet restart.
   */
  'relapse',
  /**
   * The control plane's process is SIGKILLed — its journal's commits in flight are lost — and
   * started again on the same journal when the fault's span ends; its engines live on.
   */
  'control-kill',
  /**
   * An engine is retired, as the planner retires one (app/fleet-actions.ts): it takes no new
   * rooms, and its rooms whose prefill has not begun move to other pairs. Taken back when the
   * fault ends rather than stopped, so that the fleet keeps its size.
   */
  'retire',
  /**
   * An admitted engine that lies within the protocol about the other role (fleet.ts `lie`): a
   * decode engine says the prefill of each of its rooms failed, a prefill engine that the decode
   * engine refused its pages. Its words must cost no other engine anything; it is the one taken
   * out of rotation.
   */
  'lie',
  /**
   * `--journal sqlite` only: the archive's disk fills — retention's next writes to it come up
   * short, then fail with ENOSPC — until the fault ends.
   */
  'archive-full',
  /**
   * `--journal sqlite` only: the archive's disk fails — every fsync and truncate with EIO — until
   * the fault ends; what a failed write left is not cut back, and a crash tears it.
   */
  'archive-eio',
  /**
   * An admitted engine's other lies within the protocol, one shape drawn per fault (fleet.ts
   * `LIE_SHAPES`): appends for rooms not its own, another engine's pool and epoch, a transfer's
   * checksum of bytes it never sent, prefix blocks it does not hold. None may cost another
   * engine anything or reach another client's stream.
   */
  'lie-protocol',
  /**
   * One tenant floods the API: a batch tenant with no limits of its own sends at 4× the
   * workload's rate for the fault's span (run.ts adds its requests; workload.ts `flood`). The
   * other tenants keep their band's order and their fair shares.
   */
  'flood',
] as const;

export type FaultKind = (typeof FAULT_KINDS)[number];

/** The kinds that need the SQLite journal (its archive): `all` leaves them out of the in-memory one. */
export const STORAGE_KINDS: readonly FaultKind[] = ['archive-full', 'archive-eio'];

export interface PlannedFault {
  kind: FaultKind;
  /** `lie-protocol`: what the engine lies about. */
  shape?: LieShape;
  /** The engine it hits; null for the journal and the control plane. */
  target: string | null;
  /** When it starts, in ms after the workload's start, and how long it lasts. */
  at: number;
  forMs: number;
}

/**
 * The faults of a run: a list of kinds, `all`, or `none`, for the journal the run uses (`all` of
 * the in-memory one leaves out the archive's); throws a RangeError naming a bad one.
 */
export function parseFaults(text: string, journal: 'memory' | 'sqlite' = 'memory'): FaultKind[] {
  if (text === 'none' || text === '') return [];
  if (text === 'all')
    return FAULT_KINDS.filter((k) => journal === 'sqlite' || !STORAGE_KINDS.includes(k));
  const kinds = text.split(',').map((k) => k.trim());
  for (const k of kinds) {
    if (!FAULT_KINDS.includes(k as FaultKind))
      throw new RangeError(
        `unknown fault ${JSON.stringify(k)}; the faults are ${FAULT_KINDS.join(', ')}, all or none`,
      );
    if (journal === 'memory' && STORAGE_KINDS.includes(k as FaultKind))
      throw new RangeError(
        `${k} is a fault of the archive, which only the SQLite journal writes: add --journal sqlite`,
      );
  }
  return kinds as FaultKind[];
}

/**
 * How a seed draws its faults' times and targets. `early` (what seeds recorded before issue 67
 * replay with): every fault starts within the first 70% of the workload, into one target.
 * `whole`: a fault starts anywhere in the workload or in the 30 s after it (two in five do so,
 * while what came before may still hold: a control plane killed after an engine's escalation), and
 * one in four that hits an engine hits every engine of its role at once (a bad model or driver
 * pushed to all of them).
 */
export const PLAN_SHAPES = ['early', 'whole'] as const;
export type PlanShape = (typeof PLAN_SHAPES)[number];

/** After the workload, how long a `whole` plan may still start a fault. */
const LATE_MS = 30_000;

/**
 * One to three faults of the given kinds (a correlated one counts once, with an entry per engine
 * it hits), each lasting 0.5 to 8 s — either side of the bus's 5 s heartbeat timeout — except a
 * relapse, which lasts 15 to 30 s: long enough for the ladder to restart the engine and see it
 * hang again, and a flood, 10 to 15 s: as long as a fair share's window at least. When they start and what they hit: `shape`.
 */
export function planFaults(
  random: Random,
  kinds: readonly FaultKind[],
  engines: { prefill: readonly string[]; decode: readonly string[] },
  spanMs: number,
  shape: PlanShape = 'early',
): PlannedFault[] {
  if (kinds.length === 0) return [];
  const count = random.between(1, 3);
  return Array.from({ length: count }, (): PlannedFault[] => {
    const kind = random.pick(kinds);
    const target =
      kind === 'disk-full' ||
      kind === 'flood' ||
      kind.startsWith('control-') ||
      kind.startsWith('archive-')
        ? null
        : kind.startsWith('transfer-')
          ? random.pick(engines.prefill)
          : random.pick([...engines.prefill, ...engines.decode]);
    const at =
      shape === 'early'
        ? Math.round(random.next() * spanMs * 0.7)
        : random.next() < 0.4
          ? Math.round(spanMs + random.next() * LATE_MS)
          : Math.round(random.next() * spanMs);
    const forMs =
      kind === 'relapse'
        ? random.between(15_000, 30_000)
        : kind === 'flood'
          ? random.between(10_000, 15_000)
          : random.between(500, 8000);
    const lie = kind === 'lie-protocol' ? { shape: random.pick(LIE_SHAPES) } : {};
    // A planner retires engines one at a time: it is never correlated.
    if (shape === 'whole' && target !== null && kind !== 'retire' && random.next() < 0.25) {
      const role = engines.prefill.includes(target) ? engines.prefill : engines.decode;
      return role.map((t) => ({ kind, target: t, at, forMs, ...lie }));
    }
    return [{ kind, target, at, forMs, ...lie }];
  })
    .flat()
    .sort((a, b) => a.at - b.at);
}

/** Sets the clock's timers that start each fault at its time and heal it after its span. */
export function scheduleFaults(fleet: Fleet, plan: readonly PlannedFault[]): void {
  const { clock } = fleet;
  for (const f of plan) {
    clock.setTimeout(() => {
      const heal = start(fleet, f);
      clock.setTimeout(heal, f.forMs);
    }, f.at);
  }
}

/** Starts the fault; returns what heals it. */
function start(fleet: Fleet, f: PlannedFault): () => void {
  const target = f.target as string;
  switch (f.kind) {
    case 'partition':
      fleet.cut(target);
      return () => fleet.mend(target);
    case 'kill':
      // Its span is how long the new process takes to come up (a model load).
      fleet.kill(target, f.forMs);
      return () => {};
    case 'freeze':
      fleet.freeze(target);
      return () => fleet.thaw(target);
    case 'relapse': {
      let on = true;
      fleet.freeze(target);
      const off = fleet.onStarted(target, () =>
        fleet.clock.setTimeout(() => {
          if (on) fleet.freeze(target);
        }, 1000),
      );
      return () => {
        on = false;
        off();
        fleet.thaw(target);
      };
    }
    case 'control-freeze':
      // A freeze of a process that was killed meanwhile ended with it.
      return fleet.freezeControl();
    case 'control-kill':
      // Its span is how long the new process takes to come up.
      fleet.killControl(f.forMs);
      return () => {};
    case 'retire': {
      // A control plane that is down retires nothing; the one that comes back knows of no retiring.
      const inControl = (fn: () => void) => fleet.controlUp && fleet.inControl(fn);
      inControl(() => void fleet.control.retire(target));
      return () => inControl(() => fleet.control.registry.retiring.delete(target));
    }
    case 'lie':
    case 'lie-protocol':
      fleet.lie(target, true, f.shape ?? 'blame');
      return () => fleet.lie(target, false);
    case 'disk-full':
      fleet.refuseWrites('the simulated disk is full');
      return () => fleet.refuseWrites(null);
    case 'archive-full':
    case 'archive-eio':
      return fleet.storage?.archiveFault(f.kind) ?? (() => {});
    case 'flood':
      // Its requests are the workload's (run.ts): they end as their clients are answered.
      return () => {};
    case 'transfer-stall':
    case 'transfer-corrupt': {
      // The engine may have been killed and started again since: the live one takes the fault.
      const core = () => fleet.engines.get(target)?.transfer;
      core()?.inject({ kind: f.kind === 'transfer-stall' ? 'stall' : 'corrupt' });
      return () => core()?.clearFaults();
    }
  }
}

/**
 * The engines a plan touches: only these may exit, or come back as a new incarnation. A retired
 * engine is not among them: it goes on serving the rooms it has.
 */
export function touched(plan: readonly PlannedFault[]): Set<string> {
  return new Set(plan.flatMap((f) => (f.target === null || f.kind === 'retire' ? [] : [f.target])));
}
