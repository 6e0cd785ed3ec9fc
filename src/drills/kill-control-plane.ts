/**
 * Drill `kill-control-plane`: the control plane (`pdctl serve`, its own process) is SIGKILLed
 * under load while the engines — separate processes joined over TCP — keep running. It is started
 * again on the same journal and bus: the time from spawn to ready is measured (optionally with a
 * large journal, to show start-up does not replay it), the engines reconnect and are reconciled,
 * not restarted, the rooms that were in flight are failed `orphaned_by_restart` and their pages
 * freed, and nothing the old process acknowledged is missing.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { openJournalReader } from '../app/journal.ts';
import { Admission } from '../bus/admission.ts';
import { freePort } from '../net.ts';
import { selfCommand } from '../recovery/self.ts';
import { EngineSupervisor } from '../recovery/supervisor.ts';
import type { DrillRunOptions, DrillScenario } from './harness.ts';
import { drillEngineArgs, drillServeArgs, keptProcesses, noLeakedPages } from './harness.ts';
import { Load, type RequestRecord } from './load.ts';
import { answersOk, exited, sleep, until } from './poll.ts';
import { RemoteTarget } from './remote-target.ts';
import {
  DrillRecorder,
  type DrillReport,
  drillPassed,
  type StateSample,
  timingTarget,
} from './report.ts';

const READY_TARGET_MS = 2000;

export const killControlPlane: DrillScenario = {
  name: 'kill-control-plane',
  summary:
    'SIGKILL of the control plane (pdctl serve) under load; restarted on the same journal and bus, while the engines live on',
  remote: {
    unsupported:
      'it kills the control plane and starts it again, which it can do only to a stack it started',
  },
  standalone: runKillControlPlane,
};

async function runKillControlPlane(o: DrillRunOptions): Promise<DrillReport> {
  const dir = o.journalPath.replace(/\.db$/, '');
  mkdirSync(dir, { recursive: true });
  const journalPath = join(dir, 'journal.db');
  const started = Date.now();
  const rec = new DrillRecorder(started);
  const { mark, check, timeline, invariants } = rec;
  const samples: StateSample[] = [];

  let journalEvents = 0;
  if (o.journalEvents && o.journalEvents > 0) {
    // The synthetic journal has about 9.85 events per room: ask for enough rooms.
    const rooms = Math.ceil(o.journalEvents / 9.8);
    const synth = selfCommand([
      'journal',
      'synth',
      '--rooms',
      String(rooms),
      '--journal',
      journalPath,
      '--durability',
      'process',
      '--json',
    ]);
    const t0 = Date.now();
    o.progress?.(
      `kill-control-plane: writing ~${o.journalEvents} synthetic events through the real append path first (about ${Math.max(1, Math.round(o.journalEvents / 30_000))} s here)`,
    );
    await new Promise<void>((resolve, reject) => {
      const child = spawn(synth.command, synth.args, { stdio: ['ignore', 'ignore', 'inherit'] });
      child.once('exit', (code) =>
        code === 0 ? resolve() : reject(new Error(`journal synth exited ${code}`)),
      );
    });
    const filled = openJournalReader(journalPath);
    journalEvents = await filled.headSeq();
    filled.close();
    mark(`journal pre-filled with ${journalEvents} events (synth, ${Date.now() - t0} ms)`);
  }

  const busPort = await freePort();
  const httpPort = await freePort();
  const bus = `tcp://127.0.0.1:${busPort}`;
  const base = `http://127.0.0.1:${httpPort}`;
  // Its engines are started here, not by serve: serve must know their keys, and keep its own key
  // pair (bus.key in its data directory) across the restart.
  const admission = new Admission();
  writeFileSync(join(dir, 'bus.key'), JSON.stringify(admission.server), { mode: 0o600 });
  const engineKeyArgs = ['prefill-0', 'decode-0'].flatMap((id) => [
    '--engine-key',
    `${id}=${admission.issue(id).publicKey}`,
  ]);
  const serveArgs = [
    'serve',
    ...engineKeyArgs,
    '--prefill',
    '0',
    '--decode',
    '0',
    '--bus',
    bus,
    '--port',
    String(httpPort),
    '--data-dir',
    dir,
    '--canary-interval-ms',
    '500',
    '--log-level',
    'warn',
    ...drillServeArgs(o),
  ];
  const engineArgs = drillEngineArgs(o);
  const env = { ...process.env, PDCTL_EXIT_WITH_PARENT: String(process.pid) };
  let serve: ChildProcess | null = null;
  // The control plane's own output, kept for the report if it never comes up.
  let serveErr = '';
  const startServe = () => {
    const self = selfCommand(serveArgs);
    serve = spawn(self.command, self.args, { stdio: ['ignore', 'ignore', 'pipe'], env });
    serve.stderr?.on('data', (d: Buffer) => {
      serveErr = (serveErr + d.toString()).slice(-4000);
    });
    return serve;
  };
  /** Whether the control plane answers `path` with a 2xx (false while it is down). */
  const answers = (path: string) => answersOk(base, path);
  const ready = () => answers('/health/ready');
  const engines = new EngineSupervisor({
    control: bus,
    admission,
    curve: true,
    log: o.log,
    logLevel: 'warn',
  });
  const ids = ['prefill-0', 'decode-0'];
  let load: Load | null = null;
  let fullRestartMs: number | null = null;
  const sampler = setInterval(() => {
    if (!load) return;
    const inFlight = load.inFlight;
    const by: Record<string, number> = {};
    for (const r of load.records) by[r.outcome] = (by[r.outcome] ?? 0) + 1;
    samples.push({ atMs: Date.now() - started, live: { in_flight: inFlight }, terminal: by });
  }, 100);
  try {
    startServe();
    engines.start({ id: 'prefill-0', role: 'prefill', args: engineArgs });
    engines.start({ id: 'decode-0', role: 'decode', args: engineArgs });
    if (!(await until(ready, 30_000)))
      throw new Error(`the stack never became ready; pdctl serve said: ${serveErr}`);
    mark('stack up: pdctl serve, and 1 prefill + 1 decode engine joined over TCP');
    // What the control plane says, asked as an operator would (it is the same address after the restart).
    const target = await RemoteTarget.connect(base, null);
    load = new Load({ base, model: target.model, clients: o.clients, maxTokens: 48 }).start();
    await sleep(1500);
    const before = await target.engines();
    const killAt = Date.now();
    const sentBefore = load.records.length + load.inFlight;
    mark(`fault: SIGKILL pdctl serve (${load.inFlight} requests in flight)`, killAt);
    (serve as ChildProcess | null)?.kill('SIGKILL');
    await exited(serve as unknown as ChildProcess);
    const spawnAt = Date.now();
    startServe();
    const listening = await until(() => answers('/health'), 30_000, 10);
    const listenMs = Date.now() - spawnAt;
    mark(listening ? `control plane listening again ${listenMs} ms after spawn` : 'never listened');
    const readyOk = await until(ready, 30_000, 10);
    const readyMs = Date.now() - spawnAt;
    mark(
      readyOk ? `ready (engines registered, canary ok) ${readyMs} ms after spawn` : 'never ready',
    );
    check({
      name: 'restarted and ready',
      ok: readyOk !== null,
      figure: { listenMs, journalEvents },
      detail: 'spawn → /health/ready 200: engines re-registered, canary ok',
    });
    check(
      timingTarget(
        'time from restart to ready',
        readyOk ? readyMs : Number.NaN,
        READY_TARGET_MS,
        'start-up reads the projection, not the whole journal',
      ),
    );
    await sleep(1500);
    await load.stop();
    const after = await target.engines();
    const same = keptProcesses(before, after, ids);
    check({
      name: 'engines survived: reconnected, not restarted',
      ok: same.length === ids.length,
      figure: { engines: same.length, of: ids.length },
      detail: 'same pid and incarnation before and after',
    });

    // The requests caught in the kill, and the ones answered before it.
    const caught = load.records.filter((r) => r.startedAt < killAt && r.endedAt >= killAt);
    const answered = load.records.filter((r) => r.outcome === 'completed' && r.endedAt < killAt);
    const states = async (recs: RequestRecord[]) =>
      Promise.all(recs.map(async (r) => (r.room ? (await target.timeline(r.room)).room : null)));
    const caughtRooms = (await states(caught)).filter((x) => x !== null);
    const orphaned = caughtRooms.filter(
      (x) => x.state !== 'failed' || x.reason === 'orphaned_by_restart',
    );
    check({
      name: 'rooms in flight at the kill failed as orphaned_by_restart',
      ok: orphaned.length === caughtRooms.length,
      figure: {
        rooms: caughtRooms.length,
        orphaned: caughtRooms.filter((x) => x.reason === 'orphaned_by_restart').length,
      },
      detail: `of ${sentBefore} requests sent before the kill; the rest had ended`,
    });
    const answeredRooms = await states(answered);
    const lost = answeredRooms.filter((x) => x?.state !== 'completed').length;
    check({
      name: 'zero acknowledged journal events lost',
      ok: lost === 0 && answered.length > 0,
      figure: { answered: answered.length, missing: lost },
      detail: 'every request answered before the kill has its room completed',
    });
    check(
      await noLeakedPages(
        target,
        'the orphans’ pages came back on every engine (reconciliation by replay)',
      ),
    );
    const next = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: target.model,
        prompt: 'after the drill',
        max_tokens: 4,
      }),
    });
    check({
      name: 'the next request succeeds',
      ok: next.status === 200,
      figure: { status: next.status },
      detail: 'a completion through the restarted control plane',
    });

    // The blind alternative, measured here: stop everything, start everything, serve.
    if (o.baseline !== false) {
      const t0 = Date.now();
      (serve as ChildProcess | null)?.kill('SIGKILL');
      await exited(serve as unknown as ChildProcess);
      // Killed, not drained: an engine whose control plane is gone cannot drain.
      await engines.stop(0);
      const again = new EngineSupervisor({
        control: bus,
        admission,
        curve: true,
        log: o.log,
        logLevel: 'warn',
      });
      startServe();
      again.start({ id: 'prefill-0', role: 'prefill', args: engineArgs });
      again.start({ id: 'decode-0', role: 'decode', args: engineArgs });
      if (await until(ready, 30_000, 10)) fullRestartMs = Date.now() - t0;
      mark(`baseline: a full-stack restart was ready after ${fullRestartMs ?? 'never'} ms`);
      await again.stop();
    }
  } catch (err) {
    rec.crashed(err);
  } finally {
    clearInterval(sampler);
    await load?.stop(0);
    const last = serve as ChildProcess | null;
    if (last && last.exitCode === null) {
      last.kill('SIGTERM');
      await exited(last);
    }
    await engines.stop();
  }
  const journal = openJournalReader(journalPath);
  try {
    const verify = await journal.verify();
    check({
      name: 'journal verify passes',
      ok: verify.ok,
      figure: { events: verify.events },
      detail: verify.ok ? 'projection equals the fold' : verify.problems.slice(0, 3).join('; '),
    });
  } finally {
    journal.close();
  }
  return {
    scenario: killControlPlane.name,
    summary: killControlPlane.summary,
    passed: drillPassed(invariants, o.strictTargets),
    startedAt: started,
    ms: Date.now() - started,
    timeline,
    invariants,
    samples,
    journal: journalPath,
    fullRestartMs,
    inPlace: null,
    faster: null,
    // It drives a stack of its own making: what it left is in its timeline and invariants.
    url: null,
    ended: null,
    leftBehind: null,
  };
}
