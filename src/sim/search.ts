/**
 * `npm run sim` (issue 41, item 3): runs seeds of the simulator and says, for each, what it ran
 * and whether every invariant held. A seed that breaks one prints the invariant, the seed, the
 * commit and the one command that replays it exactly, and writes the trace it committed.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { FAULT_KINDS, type FaultKind, PLAN_SHAPES, type PlanShape, parseFaults } from './faults.ts';
import { runSeed, type SeedReport } from './run.ts';

export interface SearchOptions {
  /** The first seed, and how many seeds from it. */
  seed: number;
  seeds: number;
  /** Requests per seed; null: drawn per seed (`whole`) or 200 (`early`). */
  rooms: number | null;
  /** Mean arrivals per second of virtual time. */
  rate: number;
  /** Where the traces of failing seeds go. */
  out: string;
  /** The kinds of fault each seed draws from. */
  faults: FaultKind[];
  /** A second control plane stands by on a journal with a leader (PostgreSQL's failover). */
  standby: boolean;
  /** When faults start and what they hit (faults.ts). */
  plan: PlanShape;
  /** The journal the control plane runs on (fleet.ts `journal`). */
  journal: 'memory' | 'sqlite';
}

export const SIM_USAGE = `usage: npm run sim -- [options]

Runs the whole fleet (a control plane, 2 prefill and 2 decode engines) in one process on a
virtual clock, with a seeded workload, and checks every invariant of docs/simulation.md.

  --seed S       the first seed (default: a new one, printed)
  --seeds N      how many seeds, from S on (default 1); the long search is --seeds 10000
  --rooms N      requests per seed (default: with --plan whole, 200 four seeds in five and
                 500 to 2000 the fifth; with --plan early, 200)
  --minutes M    instead of --rooms: M minutes of virtual traffic at --rate
  --rate R       requests per second of virtual time (default 50)
  --faults LIST  what each seed draws its faults from: comma-separated kinds, all, or none
                 (default); kinds: ${FAULT_KINDS.join(', ')}
  --plan SHAPE   when faults start and what they hit: whole (default) — anywhere in the
                 workload or the 30 s after it, and one in four engine faults hits every engine
                 of its role at once; early — within the first 70% of the workload, one target
                 each (seeds recorded before issue 67 replay with it)
  --journal J    memory (default), or sqlite: the control plane runs SQLite in a file as in
                 production — packing, retention into an archive, checkpoints — and disk-full
                 is a full disk under it; adds the faults archive-full and archive-eio to all,
                 and checks every committed room reads back from the journal or the archive
  --standby      a second control plane stands by, as on PostgreSQL: a killed or frozen leader
                 is replaced by it (the journal fences the old term), not restarted
  --out DIR      where traces of failing seeds are written (default sim-traces)
  --help         this text`;

export class SimUsageError extends Error {
  override name = 'SimUsageError';
}

function whole(name: string, text: string | undefined, fallback: number, min: number): number {
  if (text === undefined) return fallback;
  const v = Number(text);
  if (!Number.isSafeInteger(v) || v < min)
    throw new SimUsageError(
      `--${name} must be a whole number ≥ ${min}, got ${JSON.stringify(text)}`,
    );
  return v;
}

/** The options of a command line; throws SimUsageError saying what is wrong. */
export function parseSearch(argv: string[], newSeed: () => number): SearchOptions | 'help' {
  let values: Record<string, string | boolean | undefined>;
  try {
    values = parseArgs({
      args: argv,
      options: {
        seed: { type: 'string' },
        seeds: { type: 'string' },
        rooms: { type: 'string' },
        minutes: { type: 'string' },
        rate: { type: 'string' },
        faults: { type: 'string' },
        out: { type: 'string' },
        standby: { type: 'boolean' },
        plan: { type: 'string' },
        journal: { type: 'string' },
        help: { type: 'boolean' },
      },
      strict: true,
    }).values;
  } catch (err) {
    throw new SimUsageError(`${(err as Error).message}\n\n${SIM_USAGE}`);
  }
  if (values.help) return 'help';
  const journal = (values.journal as string | undefined) ?? 'memory';
  if (journal !== 'memory' && journal !== 'sqlite')
    throw new SimUsageError(`--journal must be memory or sqlite, got ${JSON.stringify(journal)}`);
  if (journal === 'sqlite' && values.standby)
    throw new SimUsageError(
      '--standby needs the in-memory journal (it plays PostgreSQL); drop one of --standby, --journal sqlite',
    );
  let faults: FaultKind[];
  try {
    faults = parseFaults((values.faults as string | undefined) ?? 'none', journal);
  } catch (err) {
    throw new SimUsageError(`--faults: ${(err as Error).message}`);
  }
  const plan = (values.plan as string | undefined) ?? 'whole';
  if (!PLAN_SHAPES.includes(plan as PlanShape))
    throw new SimUsageError(
      `--plan must be ${PLAN_SHAPES.join(' or ')}, got ${JSON.stringify(plan)}`,
    );
  const rate = Number(values.rate ?? 50);
  if (!(rate > 0 && Number.isFinite(rate)))
    throw new SimUsageError(
      `--rate must be a number of requests per second above 0, got ${values.rate}`,
    );
  if (values.rooms !== undefined && values.minutes !== undefined)
    throw new SimUsageError('give --rooms or --minutes, not both');
  const minutes = values.minutes === undefined ? null : Number(values.minutes);
  if (minutes !== null && !(minutes > 0 && Number.isFinite(minutes)))
    throw new SimUsageError(`--minutes must be a number above 0, got ${values.minutes}`);
  return {
    seed: whole('seed', values.seed as string | undefined, newSeed(), 0),
    seeds: whole('seeds', values.seeds as string | undefined, 1, 1),
    rooms:
      minutes !== null
        ? Math.max(1, Math.round(minutes * 60 * rate))
        : values.rooms === undefined
          ? null
          : whole('rooms', values.rooms as string, 200, 1),
    rate,
    out: (values.out as string | undefined) ?? 'sim-traces',
    faults,
    standby: values.standby === true,
    plan: plan as PlanShape,
    journal,
  };
}

/** The one command that runs `seed` again exactly. */
function replay(seed: number, o: SearchOptions): string {
  const faults = o.faults.length === 0 ? '' : ` --faults ${o.faults.join(',')}`;
  const standby = `${o.standby ? ' --standby' : ''}${o.journal === 'sqlite' ? ' --journal sqlite' : ''}`;
  const rooms = o.rooms === null ? '' : ` --rooms ${o.rooms}`;
  return `npm run sim -- --seed ${seed}${rooms} --rate ${o.rate}${faults} --plan ${o.plan}${standby}`;
}

function commit(): string {
  try {
    return execFileSync('git', ['rev-parse', '--short', 'HEAD'], {
      stdio: ['ignore', 'pipe', 'ignore'],
    })
      .toString()
      .trim();
  } catch {
    return 'unknown';
  }
}

/** Runs the seeds; returns the exit code (1 when a seed broke an invariant). */
export async function search(o: SearchOptions, print: (line: string) => void): Promise<number> {
  const at = commit();
  print(
    `pdctl sim at ${at}: ${o.seeds === 1 ? `seed ${o.seed}` : `seeds ${o.seed}..${o.seed + o.seeds - 1}`}, ${o.rooms ?? (o.plan === 'whole' ? 'drawn' : 200)} rooms each at ${o.rate}/s, plan ${o.plan}, journal ${o.journal}, faults ${o.faults.length === 0 ? 'none' : o.faults.join(',')}, fleet ${o.standby ? '2 control planes (a leader and its standby)' : '1 control plane'} + 2 prefill + 2 decode`,
  );
  let failed = 0;
  let rooms = 0;
  let wallMs = 0;
  let virtualMs = 0;
  for (let seed = o.seed; seed < o.seed + o.seeds; seed++) {
    let r: SeedReport;
    try {
      r = await runSeed({
        seed,
        ...(o.rooms === null ? {} : { rooms: o.rooms }),
        workload: { perSecond: o.rate },
        faults: o.faults,
        plan: o.plan,
        keepTrace: true,
        fleet: { standby: o.standby, journal: o.journal },
      });
    } catch (err) {
      failed++;
      print(`seed ${seed}: the run itself failed: ${(err as Error).stack ?? err}`);
      print(`  replay: ${replay(seed, o)}  (commit ${at})`);
      continue;
    }
    rooms += r.rooms;
    wallMs += r.wallMs;
    virtualMs += r.virtualMs;
    const injected = r.faults.map(
      (f) =>
        `${f.kind}${f.shape ? ` (${f.shape})` : ''}${f.target ? ` ${f.target}` : ''} at ${(f.at / 1000).toFixed(1)} s for ${(f.forMs / 1000).toFixed(1)} s`,
    );
    const first = r.leaders[0]?.acquiredAt ?? 0;
    const takeovers = r.leaders
      .slice(1)
      .map(
        (t) =>
          `${t.holder} after ${t.how.replace('_', ' ')} at ${((t.acquiredAt - first) / 1000).toFixed(1)} s`,
      );
    if (takeovers.length > 0) injected.push(`takeovers: ${takeovers.join(', ')}`);
    if (r.deposed.length > 0) injected.push(`woke deposed and exited: ${r.deposed.join(', ')}`);
    const line = `seed ${seed}: ${injected.length > 0 ? `[${injected.join('; ')}] ` : ''}${r.rooms} rooms (${r.completed} answered, ${r.ended} left by their clients, ${r.limited > 0 ? `${r.limited} held to their tenant's limits, ` : ''}${r.failed} failed)${r.tenants.length > 0 ? `, tenants ${r.tenants.map((t) => `${t.name}:${t.band}${t.maxConcurrency !== null ? `:c${t.maxConcurrency}` : ''}${t.tokensPerMinute !== null ? `:t${t.tokensPerMinute}` : ''}`).join(',')}${r.fairWindows > 0 ? ` (${r.fairWindows} fair-share windows)` : ''}` : ''}, ${r.events} events, ${(r.virtualMs / 1000).toFixed(1)} s virtual in ${(r.wallMs / 1000).toFixed(2)} s, trace ${r.traceHash.slice(0, 16)}`;
    if (r.violations.length === 0) {
      if (o.seeds <= 20 || seed === o.seed + o.seeds - 1 || (seed - o.seed) % 100 === 0)
        print(`${line}: ok`);
      continue;
    }
    failed++;
    const file = join(o.out, `seed-${seed}.jsonl`);
    mkdirSync(o.out, { recursive: true });
    writeFileSync(file, (r.trace ?? []).map((e) => `${JSON.stringify(e)}\n`).join(''));
    print(`${line}: BROKE ${r.violations.length} invariant(s)`);
    for (const v of r.violations.slice(0, 10))
      print(
        `  ${v.invariant}${v.room ? ` room ${v.room}` : ''}${v.seq ? ` seq ${v.seq}` : ''}: ${v.detail}`,
      );
    print(`  trace: ${file}`);
    print(`  replay: ${replay(seed, o)}  (commit ${at})`);
  }
  print(
    `${o.seeds - failed}/${o.seeds} seeds held every invariant; ${rooms} rooms at ${(rooms / (wallMs / 1000)).toFixed(0)} rooms per wall second, virtual time ${(virtualMs / wallMs).toFixed(0)}× wall time`,
  );
  return failed === 0 ? 0 : 1;
}
