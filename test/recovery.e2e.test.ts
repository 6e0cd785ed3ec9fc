/**
 * Recovery, first rungs: the watchdog fails a room that overstays its state (here: a decode engine
 * frozen with SIGSTOP), naming the stage; startup replay fails rooms a dead control plane left in
 * flight. Both are journaled with what was done and why.
 */
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ControlPlane } from '../src/control/control-plane.ts';
import { RoomEndedError } from '../src/control/streams.ts';
import { SqliteJournal } from '../src/journal/sqlite/journal.ts';
import { silentLogger } from '../src/log.ts';
import { collect, poolsFull, prompt, startTestStack, waitFor } from './helpers/stack.ts';
import { tempDir } from './helpers/tmp.ts';

describe('recovery', () => {
  it('the watchdog fails a room stuck past its deadline, and the engine frees it when it wakes', async () => {
    const { control, engines, watchdog } = await startTestStack({ deadlinesMs: { created: 300 } });
    engines.signal('decode-0', 'SIGSTOP');
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
    await waitFor(
      'both engines released the failed room',
      async () => (await control.journal.timeline(out.room)).room?.releasedBy.length === 2,
    );
    const next = await collect(control.submit({ prompt: prompt(2, 10), maxTokens: 4 }));
    expect(next.error).toBeNull();
    const done = Date.now();
    await waitFor('pools back to capacity', () => poolsFull(control, done));
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
    const control = await ControlPlane.start({
      journalPath: path,
      durability: 'process',
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

  it('a wedged prefill bus loop (INCIDENT.md) is detected and only that engine is restarted', async () => {
    const { control, engines, stalls } = await startTestStack();
    const ok = await collect(control.submit({ prompt: prompt(1, 10), maxTokens: 4 }));
    expect(ok.error).toBeNull();
    const prefillPid = engines.pid('prefill-0');
    const decodePid = engines.pid('decode-0');
    engines.signal('prefill-0', 'SIGUSR2');
    const frozenAt = Date.now();
    // Traffic keeps coming: the room sent to the wedged engine is what shows the wedge.
    const during = collect(control.submit({ prompt: prompt(2, 10), maxTokens: 4 }));
    await waitFor(
      'engine.stalled journaled',
      async () => (await control.journal.tail({ type: 'engine.stalled', limit: 1 })).length === 1,
    );
    const stalled = (await control.journal.tail({ type: 'engine.stalled', limit: 1 }))[0];
    expect(stalled?.engine).toBe('prefill-0');
    const detectMs = (stalled?.ts as number) - frozenAt;
    await waitFor('prefill-0 back under a new pid', () => {
      const s = control.registry.get('prefill-0');
      return s?.live === true && s.pid !== prefillPid && engines.pid('prefill-0') === s.pid;
    });
    const next = await collect(control.submit({ prompt: prompt(3, 10), maxTokens: 4 }));
    expect(next.error).toBeNull();
    const recoverMs = Date.now() - frozenAt;
    // The room caught in the wedge ended either way (resumed by the new process, or failed).
    const caught = await during;
    expect(['completed', 'failed']).toContain(
      (await control.journal.timeline(caught.room)).room?.state,
    );
    expect(engines.pid('decode-0')).toBe(decodePid);
    expect(stalls.restarts).toBe(1);
    const action = (
      await control.journal.tail({ type: 'recovery.action', engine: 'prefill-0', limit: 1 })
    )[0];
    expect(action?.data).toMatchObject({
      action: 'restart_engine',
      outcome: expect.stringMatching(/^restarted as pid \d+$/),
    });
    console.log(
      `wedged prefill: detected in ${detectMs} ms, serving again ${recoverMs} ms after the wedge`,
    );
    expect(detectMs).toBeLessThan(5_000);
  });
});
