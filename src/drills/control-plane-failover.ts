/**
 * Drill `control-plane-failover`: two control planes (`pdctl serve`) share a PostgreSQL journal;
 * one leads, the other stands by, and the engines — separate processes — are given both bus
 * endpoints. Under load the leader is SIGKILLed: the standby must be ready within 5 s, the
 * engines must follow it without restarting, and nothing the old leader acknowledged may be
 * missing. Then the roles are swapped and the new leader is frozen with SIGSTOP instead: the
 * standby takes over when the lease runs out, and the frozen one, woken up, must find itself
 * deposed and stop. Throughout: one leader at a time (terms only go up, each held by one control
 * plane), every room terminal or continued, and the journal verifies.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { drillPostgres, openJournalReader, redactJournalUrl } from '../app/journal.ts';
import { Admission } from '../bus/admission.ts';
import { freePort } from '../net.ts';
import { selfCommand } from '../recovery/self.ts';
import { EngineSupervisor } from '../recovery/supervisor.ts';
import { isTerminal } from '../room/states.ts';
import type { DrillRunOptions, DrillScenario } from './harness.ts';
import { drillEngineArgs, drillServeArgs, keptProcesses, noLeakedPages } from './harness.ts';
import { Load, type RequestRecord } from './load.ts';
import { answersOk, exited, sleep, until } from './poll.ts';
import { RemoteTarget } from './remote-target.ts';
import { DrillRecorder, type DrillReport, drillPassed, timingTarget } from './report.ts';

/** The bar: the standby ready within 5 s of the leader's SIGKILL. */
const READY_TARGET_MS = 5000;
const LEASE_MS = 1000;
/**
 * A frozen leader keeps its sockets: the standby waits out the lease, and the engines notice the
 * silence only when the bus heartbeat times out (2 s with several endpoints).
 */
const FROZEN_READY_TARGET_MS = READY_TARGET_MS + LEASE_MS;

interface ControlPlaneProcess {
  name: 'a' | 'b';
  base: string;
  bus: string;
  child: ChildProcess | null;
  stderr: string;
}

export const controlPlaneFailover: DrillScenario = {
  name: 'control-plane-failover',
  summary:
    'two control planes on a PostgreSQL journal: SIGKILL the leader under load, then SIGSTOP the next one; the standby takes over and the frozen one wakes up deposed',
  remote: {
    unsupported: 'it starts, kills and freezes two control planes of its own',
  },
  standalone: runFailover,
};

async function runFailover(o: DrillRunOptions): Promise<DrillReport> {
  const dir = o.journalPath.replace(/\.db$/, '');
  mkdirSync(dir, { recursive: true });
  const started = Date.now();
  const rec = new DrillRecorder(started);
  const { mark, check, timeline, invariants } = rec;
  o.progress?.(
    o.postgresUrl
      ? 'control-plane-failover: creating the drill database on the server given'
      : 'control-plane-failover: starting a throwaway PostgreSQL cluster (initdb) for the journal',
  );
  let db: Awaited<ReturnType<typeof drillPostgres>>;
  try {
    db = await drillPostgres(o.postgresUrl, `pdctl_drill_${Date.now()}`);
  } catch (err) {
    // Without PostgreSQL there is nothing to fail over: said plainly; part of `drill all`, skipped.
    check({
      name: 'a PostgreSQL journal to share',
      ok: false,
      skipped: o.skipUnavailable === true,
      figure: {},
      detail: `${(err as Error).message}; pass --postgres URL (a user that may CREATE DATABASE) or install PostgreSQL`,
    });
    return {
      scenario: controlPlaneFailover.name,
      summary: controlPlaneFailover.summary,
      passed: o.skipUnavailable === true,
      startedAt: started,
      ms: Date.now() - started,
      timeline,
      invariants,
      samples: [],
      journal: '(none)',
      fullRestartMs: null,
      inPlace: null,
      faster: null,
      // It drives a stack of its own making: what it left is in its timeline and invariants.
      url: null,
      ended: null,
      leftBehind: null,
    };
  }
  const journal = db.url;
  const shown = redactJournalUrl(journal);
  mark(`journal: ${shown}${db.throwaway ? ' (a throwaway cluster, removed afterwards)' : ''}`);

  // Both control planes hold the same bus key pair, so engines trust whichever leads.
  const admission = new Admission();
  const cps: ControlPlaneProcess[] = [];
  for (const name of ['a', 'b'] as const) {
    const cpDir = join(dir, name);
    mkdirSync(cpDir, { recursive: true });
    writeFileSync(join(cpDir, 'bus.key'), JSON.stringify(admission.server), { mode: 0o600 });
    cps.push({
      name,
      base: `http://127.0.0.1:${await freePort()}`,
      bus: `tcp://127.0.0.1:${await freePort()}`,
      child: null,
      stderr: '',
    });
  }
  const [a, b] = cps as [ControlPlaneProcess, ControlPlaneProcess];
  const ids = ['prefill-0', 'decode-0'];
  const engineKeyArgs = ids.flatMap((id) => [
    '--engine-key',
    `${id}=${admission.issue(id).publicKey}`,
  ]);
  const env = { ...process.env, PDCTL_EXIT_WITH_PARENT: String(process.pid) };
  const start = (cp: ControlPlaneProcess, standby: boolean) => {
    const self = selfCommand([
      'serve',
      '--journal',
      journal,
      ...(standby ? ['--standby'] : []),
      '--lease-ms',
      String(LEASE_MS),
      ...engineKeyArgs,
      '--prefill',
      '0',
      '--decode',
      '0',
      '--bus',
      cp.bus,
      '--port',
      cp.base.split(':').at(-1) as string,
      '--data-dir',
      join(dir, cp.name),
      '--canary-interval-ms',
      '500',
      '--log-level',
      'warn',
      ...drillServeArgs(o),
    ]);
    cp.stderr = '';
    cp.child = spawn(self.command, self.args, { stdio: ['ignore', 'ignore', 'pipe'], env });
    cp.child.stderr?.on('data', (d: Buffer) => {
      cp.stderr = (cp.stderr + d.toString()).slice(-64_000);
    });
  };
  const ready = (cp: ControlPlaneProcess) => answersOk(cp.base);
  const engines = new EngineSupervisor({
    // Every control plane's bus: the engines follow whichever leads.
    control: `${a.bus},${b.bus}`,
    admission,
    curve: true,
    log: o.log,
    logLevel: 'warn',
  });
  const engineArgs = drillEngineArgs(o);
  const loads: Load[] = [];
  /** Completions answered 200 by some leader: their rooms must be completed in the journal. */
  const answered: RequestRecord[] = [];
  /** Requests in flight when a leader was lost: their rooms must end terminal. */
  const caught: RequestRecord[] = [];

  /** Load on `leader` until the fault, then SIGKILL or SIGSTOP it; the other must take over. */
  const round = async (
    leader: ControlPlaneProcess,
    standby: ControlPlaneProcess,
    signal: 'SIGKILL' | 'SIGSTOP',
  ) => {
    const target = await RemoteTarget.connect(leader.base, null);
    const before = await target.engines();
    const load = new Load({
      base: leader.base,
      model: target.model,
      clients: o.clients,
      maxTokens: 48,
    }).start();
    loads.push(load);
    await sleep(1500);
    const faultAt = Date.now();
    mark(`fault: ${signal} the leader (serve ${leader.name}; ${load.inFlight} requests in flight)`);
    leader.child?.kill(signal);
    const readyAt = await until(async () => (await ready(standby)) && Date.now(), 30_000, 10);
    await load.stop(2000);
    answered.push(...load.records.filter((r) => r.outcome === 'completed'));
    caught.push(...load.records.filter((r) => r.outcome !== 'completed'));
    const readyMs = readyAt ? readyAt - faultAt : Number.NaN;
    mark(readyAt ? `serve ${standby.name} ready ${readyMs} ms after the ${signal}` : 'never ready');
    const term = /leading the journal, term (\d+) \(([^)]*)\)/.exec(standby.stderr);
    check({
      name: `${signal}: the standby took over`,
      ok: readyAt !== null && term !== null,
      figure: { term: term ? Number(term[1]) : 'none' },
      detail: term ? `serve ${standby.name}: ${term[2]}` : standby.stderr.slice(-300),
    });
    check(
      timingTarget(
        `${signal}: fault → standby ready`,
        readyMs,
        signal === 'SIGKILL' ? READY_TARGET_MS : FROZEN_READY_TARGET_MS,
        signal === 'SIGKILL'
          ? 'the leader’s database session ends with it: the standby sees the lock free at its next poll'
          : `a frozen leader keeps its session and sockets: the standby waits out the ${LEASE_MS} ms lease, the engines their bus heartbeat`,
      ),
    );
    const newTarget = await RemoteTarget.connect(standby.base, null);
    const followed = await until(async () => {
      const now = await newTarget.engines();
      return ids.every((id) => now.find((e) => e.id === id)?.live === true) && now;
    }, 15_000);
    const same = keptProcesses(before, followed || [], ids);
    check({
      name: `${signal}: the engines followed the new leader`,
      ok: same.length === ids.length,
      figure: { engines: same.length, of: ids.length },
      detail: 'same pid and incarnation, now registered with the new leader',
    });
    const next = await fetch(`${standby.base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: newTarget.model, prompt: 'after the failover', max_tokens: 4 }),
    });
    check({
      name: `${signal}: the new leader serves`,
      ok: next.status === 200,
      figure: { status: next.status },
      detail: 'a completion through it',
    });
    return newTarget;
  };

  let last: RemoteTarget | null = null;
  try {
    start(a, false);
    engines.start({ id: 'prefill-0', role: 'prefill', args: engineArgs });
    engines.start({ id: 'decode-0', role: 'decode', args: engineArgs });
    if (!(await until(() => ready(a), 30_000)))
      throw new Error(`serve a never became ready; it said: ${a.stderr}`);
    start(b, true);
    if (!(await until(async () => /standing by/.test(b.stderr), 30_000)))
      throw new Error(`serve b never stood by; it said: ${b.stderr}`);
    mark('serve a leads (engines joined over TCP, given both buses); serve b stands by');

    last = await round(a, b, 'SIGKILL');
    await exited(a.child);
    // The killed one comes back as the standby; then the new leader is frozen.
    start(a, true);
    if (!(await until(async () => /standing by/.test(a.stderr), 30_000)))
      throw new Error(`serve a never stood by again; it said: ${a.stderr}`);
    mark('serve a is back, standing by');
    last = await round(b, a, 'SIGSTOP');
    const woke = Date.now();
    b.child?.kill('SIGCONT');
    mark('SIGCONT: serve b wakes up');
    const code = await Promise.race([exited(b.child), sleep(15_000).then(() => 'still running')]);
    check({
      name: 'the frozen leader woke up deposed and stopped',
      ok: code === 3 && /pdctl serve: no longer leads the journal/.test(b.stderr),
      figure: { exitCode: String(code), ms: Date.now() - woke },
      detail:
        /pdctl serve: (no longer leads the journal[^\n]*)/.exec(b.stderr)?.[1] ??
        b.stderr.slice(-300),
    });

    // Every room is terminal or continued: none is left live from a lost leader.
    const settled = await until(async () => {
      const states = await Promise.all(
        caught.map(async (r) => (r.room ? (await last?.timeline(r.room))?.room : null)),
      );
      return states.every((s) => !s || isTerminal(s.state)) && states;
    }, 15_000);
    check({
      name: 'every room caught in a failover is terminal',
      ok: settled !== null,
      figure: { rooms: caught.filter((r) => r.room).length },
      detail: 'failed as orphans by the new leader (their clients were connected to the old one)',
    });
    const states = await Promise.all(
      answered.map(async (r) => (r.room ? (await last?.timeline(r.room))?.room : null)),
    );
    const lost = states.filter((s) => s?.state !== 'completed').length;
    check({
      name: 'zero acknowledged events lost',
      ok: lost === 0 && answered.length > 0,
      figure: { answered: answered.length, missing: lost },
      detail: 'every completion a leader answered has its room completed in the journal',
    });
    if (last) {
      check(
        await noLeakedPages(
          last,
          'the pages of the rooms the lost leaders left behind came back on every engine',
        ),
      );
    }
  } catch (err) {
    rec.crashed(err);
  } finally {
    for (const l of loads) await l.stop(0);
    for (const cp of cps) {
      if (cp.child && cp.child.exitCode === null && cp.child.signalCode === null) {
        cp.child.kill('SIGCONT');
        cp.child.kill('SIGTERM');
        await Promise.race([exited(cp.child), sleep(20_000)]);
        cp.child.kill('SIGKILL');
      }
    }
    await engines.stop(0);
  }
  const reader = openJournalReader(journal);
  try {
    const stats = await reader.stats();
    const terms = stats.leaders ?? [];
    const oneEach = terms.every((t, i) => t.term === i + 1) && terms.length >= 3;
    check({
      name: 'one leader at a time',
      ok: oneEach,
      figure: { terms: terms.length },
      detail: terms.map((t) => `term ${t.term} ${t.how}: ${t.events} events`).join('; '),
    });
    const verify = await reader.verify();
    check({
      name: 'journal verify passes (terms never go down with seq)',
      ok: verify.ok,
      figure: { events: verify.events },
      detail: verify.ok ? 'projection equals the fold' : verify.problems.slice(0, 3).join('; '),
    });
  } catch (err) {
    rec.crashed(err);
  } finally {
    reader.close();
    db.dispose();
  }
  return {
    scenario: controlPlaneFailover.name,
    summary: controlPlaneFailover.summary,
    passed: drillPassed(invariants, o.strictTargets),
    startedAt: started,
    ms: Date.now() - started,
    timeline,
    invariants,
    samples: [],
    journal: shown,
    fullRestartMs: null,
    inPlace: null,
    faster: null,
    // It drives a stack of its own making: what it left is in its timeline and invariants.
    url: null,
    ended: null,
    leftBehind: null,
  };
}
