/**
 * Recovery: the watchdog fails a room that overstays its state (here: a decode engine frozen with
 * SIGSTOP), naming the stage, and answers the client even while the journal cannot record the
 * failure; startup replay fails rooms a dead control plane left in flight;
 * engines whose history the journal does not have rejoin fresh; and the escalation ladder takes a
 * stalled engine from an in-place reset to a restart. Each step is journaled with what and why.
 *
 * An engine that wedges again after its restart being cordoned, no other engine restarted, is
 * `pdctl drill bad-engine` with real processes and the simulator's relapse seed: it moved there.
 */
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { openControlPlane } from '../src/app/stack.ts';
import { Admission } from '../src/bus/admission.ts';
import { Canary } from '../src/control/evidence/canary.ts';
import { RoomEndedError } from '../src/control/intake/streams.ts';
import { SqliteJournal } from '../src/journal/sqlite/journal.ts';
import { silentLogger } from '../src/log.ts';
import { EngineSupervisor } from '../src/recovery/supervisor.ts';
import {
  collect,
  fillJournal,
  poolsFull,
  prompt,
  sqliteFaults,
  startTestStack,
  waitFor,
} from './helpers/stack.ts';
import { tempDir } from './helpers/tmp.ts';

describe('recovery', () => {
  it('the watchdog fails a room stuck past its deadline, and the engine frees it when it wakes', async () => {
    // Both engines frozen: the room stays in created (its prefill engine would otherwise start on
    // room.created and the room wait for decode in transferred).
    const { control, engines, watchdog } = await startTestStack({ deadlinesMs: { created: 300 } });
    engines.signal('decode-0', 'SIGSTOP');
    engines.signal('prefill-0', 'SIGSTOP');
    const t0 = Date.now();
    const out = await collect(control.submit({ prompt: prompt(1, 10), maxTokens: 4 }));
    const took = Date.now() - t0;
    expect(out.error).toBeInstanceOf(RoomEndedError);
    expect(out.error).toMatchObject({
      state: 'failed',
      reason: 'deadline_exceeded',
      stage: 'created',
    });
    expect(took).toBeGreaterThanOrEqual(300);
    const t = await control.journal.timeline(out.room);
    expect(t.room).toMatchObject({
      state: 'failed',
      failedStage: 'created',
      detectedBy: 'watchdog',
    });
    const actions = () =>
      control.journal.tail({ type: 'recovery.action', room: out.room, limit: 1 });
    await waitFor('the recovery action journaled', async () => (await actions()).length === 1);
    const action = (await actions())[0];
    expect(action?.data).toMatchObject({
      action: 'fail_overdue_room',
      stage: 'created',
      outcome: 'room failed',
    });
    expect(watchdog.stats.failed).toBe(1);
    expect(watchdog.stats.lastDetectMs).toBeLessThan(1000);

    engines.signal('decode-0', 'SIGCONT');
    engines.signal('prefill-0', 'SIGCONT');
    await waitFor(
      'both engines released the failed room',
      async () => (await control.journal.timeline(out.room)).room?.releasedBy.length === 2,
    );
    const next = await collect(control.submit({ prompt: prompt(2, 10), maxTokens: 4 }));
    expect(next.error).toBeNull();
    const done = Date.now();
    await waitFor('pools back to capacity', () => poolsFull(control, done));
  });

  it('a room overdue while the journal cannot be written: its client is answered at once, the journal records the failure once it can', async () => {
    // Decoding takes ~10 s (200 tokens at 50 ms); its deadline is 1.5 s.
    const { control, journal, watchdog } = await startTestStack({
      deadlinesMs: { decoding: 1500 },
      // The watchdog answers first here: the control plane's own outage answer is for later.
      journalOutageGraceMs: 60_000,
      engineArgs: ['--decode-us-per-token', '50000'],
    });
    const stream = control.submit({ prompt: prompt(1, 10), maxTokens: 200 });
    const out = collect(stream);
    await waitFor('the room decoding', () => control.room(stream.room)?.state === 'decoding');
    const decodingSince = control.room(stream.room)?.stateSince as number;
    await fillJournal(journal);
    expect(control.journal.health().writable).toBe(false);

    const { error } = await out;
    const answeredAt = Date.now();
    expect(error).toBeInstanceOf(RoomEndedError);
    expect(error).toMatchObject({ state: 'unavailable' });
    expect(error?.message).toMatch(
      /decoding overstayed its 1500 ms deadline and the journal cannot record that now/,
    );
    // Answered within a few watchdog ticks of the deadline, not when the journal came back.
    expect(answeredAt - decodingSince).toBeLessThan(1500 + 2000);
    expect(watchdog.stats.endedUnrecorded).toBe(1);
    expect((await control.journal.timeline(stream.room)).room?.state).toBe('decoding');

    await sqliteFaults(journal).limitPages(null);
    await waitFor(
      'the failure journaled once the journal takes writes',
      async () => (await control.journal.timeline(stream.room)).room?.state === 'failed',
    );
    expect((await control.journal.timeline(stream.room)).room).toMatchObject({
      reason: 'deadline_exceeded',
      failedStage: 'decoding',
      detectedBy: 'watchdog',
    });
    expect(watchdog.stats.endedUnrecorded).toBe(1);
  });

  it('a restarted control plane fails the rooms the previous one left in flight', async () => {
    const path = join(tempDir('pdctl-orphans-'), 'journal.db');
    const before = await SqliteJournal.open({ path, durability: 'process' });
    for (const [room, steps] of [
      ['r-left-1', 0],
      ['r-left-2', 2],
    ] as const) {
      await before.append({
        type: 'room.created',
        room,
        source: 'test',
        data: { prefillEngine: 'p0', decodeEngine: 'd0', promptTokens: 3, maxTokens: 2 },
      });
      if (steps > 0) {
        await before.append({
          type: 'room.bootstrap_started',
          room,
          engine: 'd0',
          source: 'test',
          data: {},
        });
        await before.append({
          type: 'room.bootstrapped',
          room,
          engine: 'd0',
          source: 'test',
          data: { pages: [0] },
        });
      }
    }
    await before.drain();
    const { control } = await openControlPlane({
      journalPath: path,
      durability: 'process',
      admission: new Admission(),
      log: silentLogger,
      version: 'test',
    });
    try {
      const one = await control.journal.timeline('r-left-1');
      const two = await control.journal.timeline('r-left-2');
      expect(one.room).toMatchObject({
        state: 'failed',
        reason: 'orphaned_by_restart',
        failedStage: 'created',
        detectedBy: 'control',
      });
      expect(two.room).toMatchObject({
        state: 'failed',
        reason: 'orphaned_by_restart',
        failedStage: 'waiting_for_input',
      });
      const action = (await control.journal.tail({ type: 'recovery.action', limit: 1 }))[0];
      expect(action?.data).toMatchObject({
        action: 'fail_orphaned_rooms',
        outcome: '2 rooms failed',
      });
      expect((await control.journal.verify()).ok).toBe(true);
    } finally {
      await control.close();
    }
  });

  it('engines that applied past the end of a replaced journal are told to rejoin fresh, and do', async () => {
    const dir = tempDir('pdctl-replaced-');
    const admission = new Admission();
    const open = (name: string, bus: string) =>
      openControlPlane({
        journalPath: join(dir, name),
        durability: 'process',
        bus,
        admission,
        log: silentLogger,
        version: 'test',
      }).then((o) => o.control);
    const first = await open('a.db', 'tcp://127.0.0.1:0');
    const engines = new EngineSupervisor({
      control: first.endpoint,
      admission,
      curve: true,
      log: silentLogger,
      logLevel: 'error',
    });
    try {
      engines.start({ id: 'prefill-0', role: 'prefill', args: [] });
      engines.start({ id: 'decode-0', role: 'decode', args: [] });
      await first.waitForEngines(1, 1, 30_000);
      const old = first.registry.get('decode-0')?.incarnation;
      for (let i = 0; i < 3; i++)
        expect(
          (await collect(first.submit({ prompt: prompt(i, 10), maxTokens: 4 }))).error,
        ).toBeNull();
      await first.close();
      // Another journal on the same bus: it ends long before what the engines applied.
      const second = await open('b.db', first.endpoint);
      try {
        await waitFor(
          'the reconcile step journaled',
          async () => (await second.journal.tail({ type: 'recovery.action' })).length >= 2,
          20_000,
        );
        const actions = await second.journal.tail({ type: 'recovery.action' });
        expect(actions[0]?.data).toMatchObject({
          action: 'reconcile',
          outcome: 'engine told to rejoin as a fresh process',
        });
        // They exited, the supervisor started them again, and they joined with nothing to reconcile.
        await waitFor(
          'fresh engines registered',
          () => {
            const d = second.registry.get('decode-0');
            return (
              d?.delivery.live === true &&
              d.incarnation !== old &&
              second.registry.get('prefill-0')?.delivery.live === true
            );
          },
          20_000,
        );
        const out = await collect(second.submit({ prompt: prompt(9, 10), maxTokens: 4 }));
        expect(out.error).toBeNull();
      } finally {
        await second.close();
      }
    } finally {
      await engines.stop();
    }
  });

  it('a crash-looping engine is restarted with back-off, then given up on', async () => {
    const exits: Array<{ at: number; code: number | null }> = [];
    let gaveUp: string | null = null;
    const engines = new EngineSupervisor({
      control: 'tcp://127.0.0.1:9',
      admission: new Admission(),
      curve: true,
      log: silentLogger,
      logLevel: 'error',
      maxCrashes: 2,
      crashWindowMs: 60_000,
      onExit: (_id, _pid, status) => exits.push({ at: Date.now(), code: status.code }),
      onGiveUp: (_id, reason) => {
        gaveUp = reason;
      },
    });
    try {
      // An engine that cannot start: it exits 2 (bad flag) every time.
      engines.start({ id: 'decode-9', role: 'decode', args: ['--pages', '0'] });
      await waitFor('the supervisor gives up', () => gaveUp !== null, 30_000);
      expect(gaveUp).toMatch(/^crash loop: 3 exits in 60 s \(last: code 2\)$/);
      expect(exits.map((e) => e.code)).toEqual([2, 2, 2]);
      // Back-off between restarts: 200 ms, then 400 ms (plus the process's own start).
      expect((exits[2]?.at as number) - (exits[1]?.at as number)).toBeGreaterThanOrEqual(400);
      expect(engines.pid('decode-9')).toBeUndefined();
      await new Promise((r) => setTimeout(r, 1000));
      expect(exits).toHaveLength(3);
    } finally {
      await engines.stop();
    }
  });

  it('a wedged prefill bus loop (docs/incident.md) is reset in place: no process restarts', async () => {
    const { control, engines, ladder } = await startTestStack();
    const ok = await collect(control.submit({ prompt: prompt(1, 10), maxTokens: 4 }));
    expect(ok.error).toBeNull();
    const pids = { prefill: engines.pid('prefill-0'), decode: engines.pid('decode-0') };
    const incarnation = control.registry.get('prefill-0')?.incarnation;
    engines.signal('prefill-0', 'SIGUSR2');
    const frozenAt = Date.now();
    // Traffic keeps coming: the room sent to the wedged engine is what shows the wedge.
    const during = collect(control.submit({ prompt: prompt(2, 10), maxTokens: 4 }));
    await waitFor(
      'engine.recovered journaled',
      async () => (await control.journal.tail({ type: 'engine.recovered', limit: 1 })).length === 1,
    );
    const [stalled] = await control.journal.tail({ type: 'engine.stalled', limit: 1 });
    expect(stalled?.engine).toBe('prefill-0');
    const detectMs = (stalled?.ts as number) - frozenAt;
    const next = await collect(control.submit({ prompt: prompt(3, 10), maxTokens: 4 }));
    expect(next.error).toBeNull();
    const recoverMs = Date.now() - frozenAt;
    // The room caught in the wedge resumes: the new connection replays what the engine missed.
    const caught = await during;
    expect(caught.error).toBeNull();
    expect((await control.journal.timeline(caught.room)).room?.state).toBe('completed');
    // Same processes, same incarnation: nothing was restarted.
    expect({ prefill: engines.pid('prefill-0'), decode: engines.pid('decode-0') }).toEqual(pids);
    expect(control.registry.get('prefill-0')?.incarnation).toBe(incarnation);
    expect(ladder.restarts).toBe(0);
    const actions = await control.journal.tail({ type: 'recovery.action', engine: 'prefill-0' });
    expect(actions.map((a) => [a.data.action, a.data.outcome])).toEqual([
      ['reset_in_place', 'requested (SIGHUP)'],
      ['reset_in_place', 'recovered'],
    ]);
    expect(ladder.view('prefill-0')).toMatchObject({ phase: 'ok', resets: 1, restarts: 0 });
    console.log(
      `wedged prefill: detected in ${detectMs} ms, serving again ${recoverMs} ms after the wedge, no restart`,
    );
    expect(detectMs).toBeLessThan(5_000);
  });

  it('canaries failing in a row count against the engine that owns their stage, until one passes', async () => {
    // Watch only (no ladder): the compute of the prefill engine hangs; its process lives on.
    const { control } = await startTestStack({
      restartStalled: false,
      engineArgs: ['--allow-fault-injection'],
    });
    const canary = new Canary(control, silentLogger, 300);
    expect((await canary.run()).ok).toBe(true);
    expect(control.command('prefill-0', 'inject_fault', null, 'compute_hang')).toBe(true);
    await waitFor('the hang to take', async () => {
      const r = await canary.run();
      return !r.ok && r.stage === 'prefill';
    });
    await canary.run();
    await canary.run();
    const p0 = control.registry.get('prefill-0');
    expect(p0?.health.canaryFailures).toBeGreaterThanOrEqual(3);
    expect(p0?.health.canaryReason).toMatch(/^prefill: no progress past prefilling within 300 ms$/);
    expect(control.registry.get('decode-0')?.health.canaryFailures).toBe(0);
    const kinds = control.stalledEngines().map((x) => `${x.engine}:${x.kind}`);
    expect(kinds.some((k) => k === 'prefill-0:canary' || k === 'prefill-0:work')).toBe(true);
    // Cleared: the next canary passes and the count is gone.
    control.command('prefill-0', 'inject_fault', null, 'none');
    await waitFor('a canary to pass', async () => (await canary.run(2000)).ok);
    expect(control.registry.get('prefill-0')?.health.canaryFailures).toBe(0);
  });
});
