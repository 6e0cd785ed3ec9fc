/**
 * Partition drills, on test hosts (src/drills/hosts.ts: network namespaces joined by veth pairs,
 * each with its own /dev/shm) made for the drill and removed after it. `pdctl serve` runs on host
 * c; host a runs a prefill and a decode engine, host b a second decode engine; every engine
 * reaches the control plane over its own link, and KV from a to b moves over UCX. A partition is
 * a link set down (the machine has no netem): nothing is delivered, nothing is refused.
 *
 *   partition-kv      the a–b link goes down while rooms transfer over it, then comes back: the
 *                     rooms caught fail within their transfer deadline, new rooms take the pair
 *                     on host a, and once healed the cross-host pair carries KV again.
 *   partition-engine  host b is cut off from the control plane, then healed: the silent decode
 *                     engine is fenced, its rooms continue on host a's pair with identical text,
 *                     and on healing it is refused, exits, and rejoins as a new incarnation.
 *
 * Each engine runs as a system service would on its host: started again when it exits.
 */
import type { ChildProcess } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Admission } from '../bus/admission.ts';
import { ENGINE_APPENDS } from '../control/engines/engine-appends.ts';
import { selfCommand } from '../recovery/self.ts';
import type { JournalEvent, JournalEventOf } from '../room/events.ts';
import { ucxBackend } from '../transfer/ucx.ts';
import {
  commonInvariants,
  type DrillRunOptions,
  type DrillScenario,
  drillEngineArgs,
  drillServeArgs,
  keptProcesses,
} from './harness.ts';
import { TestHosts, testHostsUnavailable } from './hosts.ts';
import { Load } from './load.ts';
import { answersOk, exited, sleep, until } from './poll.ts';
import { RemoteTarget } from './remote-target.ts';
import {
  DrillRecorder,
  type DrillReport,
  drillPassed,
  type Invariant,
  type StateSample,
} from './report.ts';

const HTTP_PORT = 18080;
const BUS_PORT = 15557;
/**
 * How long each partition lasts: for partition-kv past the transfer deadline (10 s, docs/design.md
 * §3), so that rooms are seen choosing around the cut; for partition-engine past the heartbeat
 * limit after which a silent engine is fenced (5 s).
 */
const HOLD_MS = { kv: 14_000, engine: 8000 } as const;
/** The engines, where they run, and which host's link UCX uses (the one towards host a or b). */
const ENGINES = [
  { id: 'prefill-a', role: 'prefill', host: 'a', towards: 'b' },
  { id: 'decode-a', role: 'decode', host: 'a', towards: 'b' },
  { id: 'decode-b', role: 'decode', host: 'b', towards: 'a' },
] as const;

type EngineId = (typeof ENGINES)[number]['id'];

export const partitionKv: DrillScenario = {
  name: 'partition-kv',
  summary:
    'the link between the prefill host and a decode host goes down during UCX transfers, then heals (test hosts)',
  defaultClients: 8,
  remote: {
    unsupported: 'it makes its own test hosts (network namespaces) and runs pdctl in them',
  },
  standalone: (o) => runPartition(o, 'kv'),
};

export const partitionEngine: DrillScenario = {
  name: 'partition-engine',
  summary:
    'a decode engine’s host is cut off from the control plane, then healed: fenced, its rooms moved, back as a new incarnation (test hosts)',
  defaultClients: 8,
  remote: {
    unsupported: 'it makes its own test hosts (network namespaces) and runs pdctl in them',
  },
  standalone: (o) => runPartition(o, 'engine'),
};

/**
 * A process on a test host kept running as systemd would (Restart=always): started again half a
 * second after it exits, until stopped.
 */
class HostProcess {
  child: ChildProcess | null = null;
  starts = 0;
  private stopped = false;
  private timer: NodeJS.Timeout | null = null;
  /** The end of what it wrote to stderr, for the report when it fails. */
  stderr = '';

  constructor(
    private readonly hosts: TestHosts,
    readonly host: string,
    private readonly args: string[],
    private readonly env: NodeJS.ProcessEnv,
  ) {}

  start(): void {
    if (this.stopped) return;
    const self = selfCommand(this.args);
    const child = this.hosts.spawn(this.host, self.command, self.args, { env: this.env });
    this.starts++;
    child.stdout?.resume();
    child.stderr?.on('data', (d: Buffer) => {
      this.stderr = (this.stderr + d.toString()).slice(-3000);
    });
    child.once('exit', () => {
      if (this.stopped) return;
      this.timer = setTimeout(() => this.start(), 500);
    });
    this.child = child;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    const child = this.child;
    if (!child?.pid || child.exitCode !== null || child.signalCode !== null) return;
    const gone = exited(child);
    process.kill(-child.pid, 'SIGTERM');
    const t = setTimeout(() => {
      try {
        process.kill(-(child.pid as number), 'SIGKILL');
      } catch {
        // gone
      }
    }, 5000);
    await gone;
    clearTimeout(t);
  }
}

async function runPartition(o: DrillRunOptions, kind: 'kv' | 'engine'): Promise<DrillReport> {
  const scenario = kind === 'kv' ? partitionKv : partitionEngine;
  const started = Date.now();
  const rec = new DrillRecorder(started, (w) => o.progress?.(`${scenario.name}: ${w}`));
  const { mark, check, timeline, invariants } = rec;
  const samples: StateSample[] = [];
  const dir = o.journalPath.replace(/\.db$/, '');
  const journalPath = join(dir, 'journal.db');
  const report = (passed: boolean): DrillReport => ({
    scenario: scenario.name,
    summary: scenario.summary,
    passed,
    startedAt: started,
    ms: Date.now() - started,
    timeline,
    invariants,
    samples,
    journal: journalPath,
    fullRestartMs: null,
    inPlace: null,
    faster: null,
    // It drives a stack of its own making: what it left is in its timeline and invariants.
    url: null,
    ended: null,
    leftBehind: null,
  });

  const why =
    testHostsUnavailable() ??
    (ucxBackend().available ? null : `UCX is not available (${ucxBackend().reason})`);
  if (why) {
    check({
      name: 'test hosts with UCX between them',
      ok: false,
      skipped: o.skipUnavailable === true,
      figure: {},
      detail: `${why}; the partition drills need root, ip netns and UCX (docs/drills.md)`,
    });
    return report(o.skipUnavailable === true);
  }

  mkdirSync(dir, { recursive: true });
  const hosts = await TestHosts.create({ names: ['a', 'b', 'c'], reach: ['c'], shmSize: '1g' });
  const admission = new Admission();
  writeFileSync(join(dir, 'bus.key'), JSON.stringify(admission.server), { mode: 0o600 });
  const exitWithUs = { PDCTL_EXIT_WITH_PARENT: String(process.pid) };
  const serve = new HostProcess(
    hosts,
    'c',
    [
      'serve',
      // Test hosts of the drill's own: their network is the drill's, open on purpose.
      '--allow-open',
      '--host',
      '0.0.0.0',
      '--port',
      String(HTTP_PORT),
      '--bus',
      `tcp://0.0.0.0:${BUS_PORT}`,
      '--prefill',
      '0',
      '--decode',
      '0',
      '--data-dir',
      dir,
      '--durability',
      'process',
      '--canary-interval-ms',
      '500',
      '--log-level',
      'warn',
      ...ENGINES.flatMap((e) => ['--engine-key', `${e.id}=${admission.issue(e.id).publicKey}`]),
      ...drillServeArgs(o),
    ],
    { ...process.env, ...exitWithUs },
  );
  const engines = new Map<EngineId, HostProcess>(
    ENGINES.map((e) => [
      e.id,
      new HostProcess(
        hosts,
        e.host,
        [
          'engine',
          '--role',
          e.role,
          '--id',
          e.id,
          '--control',
          `tcp://${hosts.address('c', e.host)}:${BUS_PORT}`,
          '--kv-transport',
          'auto',
          '--log-level',
          'warn',
          ...drillEngineArgs(o, ['--pages', '8192']),
        ],
        {
          ...process.env,
          ...exitWithUs,
          ...admission.engineEnv(e.id),
          UCX_TLS: process.env.UCX_TLS ?? 'tcp',
          UCX_NET_DEVICES: hosts.device(e.host, e.towards),
        },
      ),
    ]),
  );
  const base = `http://${hosts.address('c', 'self')}:${HTTP_PORT}`;
  let load: Load | null = null;
  const sampler = setInterval(() => {
    if (!load) return;
    const by: Record<string, number> = {};
    for (const r of load.records) by[r.outcome] = (by[r.outcome] ?? 0) + 1;
    samples.push({
      atMs: Date.now() - started,
      live: { in_flight: load.inFlight },
      terminal: by,
    });
  }, 200);
  try {
    serve.start();
    for (const e of engines.values()) e.start();
    const ready = await until(() => answersOk(base), 60_000);
    if (!ready)
      throw new Error(
        `the stack on the test hosts never became ready; pdctl serve said: ${serve.stderr.trim() || '(nothing)'}; engines: ${[
          ...engines,
        ]
          .map(([id, p]) => `${id}: ${p.stderr.trim().slice(-300) || '(nothing)'}`)
          .join(' | ')}`,
      );
    mark('stack up: serve on host c; prefill-a and decode-a on host a, decode-b on host b');
    // The journal is a file this process can read (the hosts share its file system).
    const target = await RemoteTarget.connect(base, null, { sameHost: true });
    load = new Load({ base, model: target.model, clients: o.clients, maxTokens: 48 }).start();
    const overUcx = async (since: number) =>
      (await target.events('room.transfer_completed', since)).find(
        (e) => e.data.transport === 'ucx',
      ) ?? null;
    const first = await until(() => overUcx(started), 30_000, 100);
    if (!first) throw new Error('no room moved its KV over UCX from host a to host b within 30 s');
    mark('rooms move KV over UCX from host a to host b', first.ts);
    const before = await target.engines();

    const cutAt = Date.now();
    if (kind === 'kv') {
      await hosts.setLink('a', 'b', false);
      mark('fault: the link between hosts a and b is down (prefill-a ↛ decode-b)', cutAt);
    } else {
      await hosts.setLink('b', 'c', false);
      mark('fault: host b is cut off from the control plane (decode-b ↛ serve)', cutAt);
    }
    await sleep(HOLD_MS[kind]);
    const healAt = Date.now();
    await hosts.setLink(kind === 'kv' ? 'a' : 'b', kind === 'kv' ? 'b' : 'c', true);
    mark('healed: the link is up again', healAt);

    let detectedAt: number | null = null;
    let recoveredAt: number | null = null;
    if (kind === 'kv') {
      // Detected: the first room the cut failed; recovered: KV over UCX again after the heal.
      const failed = (await target.events('room.failed', cutAt)).filter((e) =>
        e.data.reason.startsWith('transfer_'),
      );
      failed.sort((x, y) => x.seq - y.seq);
      detectedAt = failed[0]?.ts ?? null;
      if (detectedAt) mark(`first room failed by the cut (${failedReasons(failed)})`, detectedAt);
      const back = await until(() => overUcx(healAt), 30_000, 100);
      recoveredAt = back?.ts ?? null;
      if (back) mark('KV over UCX from host a to host b again', back.ts);
      // The cut's failures are counted where an alert would look.
      const metrics = await (await fetch(`${base}/metrics`)).text();
      const counted = [
        ...metrics.matchAll(
          /^pdctl_transfers_total\{status="(?!ok")([a-z_]+)",transport="ucx"\} (\d+)$/gm,
        ),
      ].reduce((n, m) => n + Number(m[2]), 0);
      check({
        name: 'the cut’s failed transfers counted in /metrics',
        ok: counted >= failed.length && failed.length > 0,
        figure: { counted, failedRooms: failed.length },
        detail: 'pdctl_transfers_total{status≠"ok",transport="ucx"} (stalled, failed, …)',
      });
      const rooms = await target.events('room.created', cutAt);
      const during = rooms.filter((e) => e.ts > (detectedAt ?? cutAt) && e.ts < healAt);
      const farDuring = during.filter((e) => e.data.decodeEngine === 'decode-b');
      check({
        name: 'rooms created during the partition avoid the cut pair',
        ok: during.length > 0 && farDuring.length <= 2,
        figure: { rooms: during.length, toCutPair: farDuring.length },
        detail:
          'after a transfer to decode-b failed, new rooms take host a’s pair (at most a probe or two try the cut pair)',
      });
    } else {
      const fenced = await until(async () => {
        const xs = await target.events('recovery.action', cutAt, 'decode-b');
        return xs.find((e) => e.data.action === 'fence_engine') ?? null;
      }, 5000);
      detectedAt = fenced?.ts ?? null;
      if (fenced) mark(`decode-b fenced: ${String(fenced.data.reason)}`, fenced.ts);
      const rejoined = await until(async () => {
        const d = (await target.engines()).find((e) => e.id === 'decode-b');
        const old = before.find((e) => e.id === 'decode-b');
        return d?.live && d.heartbeatAgeMs !== null && d.incarnation !== old?.incarnation
          ? Date.now()
          : null;
      }, 30_000);
      recoveredAt = rejoined;
      if (rejoined) mark('decode-b back as a new incarnation', rejoined);
      check({
        name: 'the partitioned engine was fenced and rejoined as a new incarnation',
        ok: fenced !== null && rejoined !== null,
        figure: { starts: engines.get('decode-b')?.starts ?? 0 },
        detail: fenced
          ? 'BUS_FENCED on healing; it exited and its service started it again'
          : 'never fenced',
      });
      check(await noStaleAppends(target, cutAt));
    }
    check({
      name: 'time to detect and to recover',
      ok: detectedAt !== null && recoveredAt !== null,
      figure: {
        detectMs: detectedAt === null ? 'never' : detectedAt - cutAt,
        recoverMs: recoveredAt === null ? 'never' : recoveredAt - healAt,
      },
      detail:
        kind === 'kv'
          ? 'cut → first room failed by it; heal → first KV over UCX again'
          : 'cut → decode-b fenced; heal → decode-b serving as a new incarnation',
    });
    await sleep(1000);
    await load.stop();
    const after = await target.engines();
    const healthy = ENGINES.map((e) => e.id).filter((id) => kind === 'kv' || id !== 'decode-b');
    const kept = keptProcesses(before, after, healthy);
    check({
      name: 'engines on the healthy side not restarted',
      ok: kept.length === healthy.length,
      figure: { engines: kept.length, of: healthy.length },
      detail: `${healthy.join(', ')}: same pid and incarnation before and after`,
    });
    await commonInvariants({ target, check, mark, sleep }, started, [load], []);
    // Each host's /dev/shm holds the pools of its engines now running, and nothing else of pdctl's
    // (a fenced engine removes its pool as it exits).
    const pids = new Set((await target.engines()).map((e) => e.pid));
    let pools = 0;
    const stale: string[] = [];
    for (const h of ['a', 'b']) {
      const ls = await hosts.run(h, 'ls', ['/dev/shm']);
      for (const name of ls.stdout.split('\n')) {
        const m = /^pdctl-.+-(\d+)$/.exec(name.trim());
        if (!m) continue;
        pools++;
        if (!pids.has(Number(m[1]))) stale.push(`${h}:${name.trim()}`);
      }
    }
    check({
      name: 'no pool left behind on any host',
      ok: stale.length === 0 && pools === ENGINES.length,
      figure: { pools, stale: stale.length },
      detail:
        stale.length === 0
          ? 'each host’s /dev/shm holds exactly the pools of its running engines'
          : stale.join(', '),
    });
  } catch (err) {
    rec.crashed(err);
  } finally {
    clearInterval(sampler);
    await load?.stop(0);
    await Promise.all([...engines.values()].map((e) => e.stop()));
    await serve.stop();
    hosts.destroy();
  }
  return report(drillPassed(invariants, o.strictTargets));
}

function failedReasons(events: JournalEventOf<'room.failed'>[]): string {
  const by = new Map<string, number>();
  for (const e of events) {
    const r = e.data.reason;
    by.set(r, (by.get(r) ?? 0) + 1);
  }
  return [...by].map(([r, n]) => `${n}× ${r}`).join(', ');
}

/**
 * Nothing the fenced incarnation sent was applied to the rooms taken from it: no event of decode-b's
 * own (source `engine:decode-b`) on a room after that room was migrated away.
 */
async function noStaleAppends(target: RemoteTarget, cutAt: number): Promise<Invariant> {
  const appended: JournalEvent[] = [];
  for (const type of ENGINE_APPENDS.decode)
    appended.push(...(await target.events(type, cutAt, 'decode-b')));
  const own = appended.filter((e) => e.source === 'engine:decode-b' && e.room !== null);
  const timelines = await Promise.all(own.map((e) => target.timeline(e.room as string)));
  const stale = own.filter((e, i) => {
    const migrated = timelines[i]?.events.find((x) => x.type === 'room.migrated');
    return migrated !== undefined && migrated.seq < e.seq;
  });
  return {
    name: 'no stale append of the fenced incarnation applied',
    ok: stale.length === 0,
    figure: { staleEvents: stale.length, engineEventsSinceCut: own.length },
    detail:
      'no event from decode-b itself lands on a room after that room was migrated away from it',
  };
}
