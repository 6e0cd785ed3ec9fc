/**
 * The planner acting on a stack it supervises (`--planner act`): under a steady load, a prefill
 * engine more than the load needs is retired — drained, stopped, forgotten — while requests keep
 * coming, and none of them fails.
 */
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { type Serving, startServing } from '../src/app/serving.ts';
import { silentLogger } from '../src/log.ts';
import { tempDir } from './helpers/tmp.ts';

let serving: Serving | undefined;
afterAll(() => serving?.close());

describe('planner act', () => {
  it('retires an idle prefill engine under load: drained first, every request answered, each state journaled', async () => {
    serving = await startServing({
      journalPath: join(tempDir('pdctl-planner-'), 'journal.db'),
      durability: 'process',
      log: silentLogger,
      version: 'test',
      engineLogLevel: 'error',
      canaryIntervalMs: 0,
      prefillEngines: 2,
      decodeEngines: 1,
      planner: { mode: 'act', intervalMs: 1000, hold: 1 },
    });
    const { control, journal } = serving.stack;
    const outcomes: Array<{ ok: boolean; why?: string }> = [];
    let running = true;
    const client = async () => {
      while (running) {
        try {
          const r = await control.submit({ prompt: 'the lighthouse keeper', maxTokens: 6 }).result;
          outcomes.push({ ok: r.tokens === 6 });
        } catch (err) {
          outcomes.push({ ok: false, why: (err as Error).message });
        }
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    const clients = [client(), client()];
    const lifecycle = () => journal.tail({ type: 'engine.lifecycle', limit: 20, order: 'oldest' });
    const deadline = Date.now() + 30_000;
    while (!(await lifecycle()).some((e) => e.data.state === 'stopped') && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 100));
    // Requests go on after the retirement, on the engines left.
    const after = outcomes.length;
    while (outcomes.length < after + 10 && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 50));
    running = false;
    await Promise.all(clients);

    const states = await lifecycle();
    expect(states.map((e) => [e.data.state, e.data.role, e.data.reason])).toEqual([
      ['draining', 'prefill', 'prefill_idle'],
      ['drained', 'prefill', 'prefill_idle'],
      ['stopped', 'prefill', 'prefill_idle'],
    ]);
    const retired = states[0]?.engine as string;
    expect(states.every((e) => e.engine === retired)).toBe(true);
    expect(states[1]?.data.rooms, 'drained before the deadline').toBe(0);
    expect(outcomes.length).toBeGreaterThan(after);
    expect(outcomes.filter((o) => !o.ok)).toEqual([]);
    const exits = await journal.tail({ type: 'engine.exited', engine: retired, limit: 5 });
    expect(exits.map((e) => e.data.expected)).toEqual([true]);
    const acted = (await journal.tail({ type: 'planner.decision', limit: 50 })).filter(
      (e) => e.data.acted,
    );
    expect(acted.map((e) => [e.data.reason, e.data.proposal])).toEqual([
      ['prefill_idle', { prefill: 1, decode: 1 }],
    ]);
    expect(
      control
        .engines()
        .map((e) => e.engine)
        .sort(),
    ).not.toContain(retired);
    // Every room completed, but one the retirement moved before its prefill began (migrated,
    // engine_retiring: its continuation on another pair answered the client, above).
    const rooms = await journal.rooms({ limit: 1000 });
    const moved = (r: (typeof rooms.rooms)[number]) =>
      r.state === 'migrated' && r.reason === 'engine_retiring' && r.prefillEngine === retired;
    expect(rooms.rooms.filter((r) => r.state !== 'completed' && !moved(r))).toEqual([]);
  }, 60_000);
});
