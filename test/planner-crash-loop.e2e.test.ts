/**
 * The planner acting on a stack it supervises (`--planner act`), when an engine it starts
 * crash-loops: the supervisor gives up on it, and the planner writes it off — journaled stopped,
 * forgotten, its id not reused, no other of its role started for a while — while the engines serve
 * started serve on. (Its own file: one process holds one control plane with CURVE.)
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import { PDCTL_BIN } from './helpers/spawn.ts';
import { collect, startTestStack } from './helpers/stack.ts';
import { tempDir } from './helpers/tmp.ts';

describe('planner act, an engine that crash-loops', () => {
  it('writes off an engine it started that crash-loops: journaled stopped, forgotten, its role held', async () => {
    // Engines start through this entry: prefill-1, the one the planner starts, exits at once
    // every time (as with a bad flag or a bad host); the others are pdctl's own.
    const entry = join(tempDir('pdctl-planner-entry-'), 'engine.mjs');
    writeFileSync(
      entry,
      [
        "if (process.argv[process.argv.indexOf('--id') + 1] === 'prefill-1') process.exit(1);",
        `await import(${JSON.stringify(pathToFileURL(PDCTL_BIN).href)});`,
      ].join('\n'),
    );
    const stack = await startTestStack({
      engineEntry: entry,
      planner: { mode: 'act', intervalMs: 3_600_000 },
    });
    const { control, journal } = stack;
    const started = Date.now();
    // The step ends once its engine is written off (not at the 30 s wait for it to register).
    await stack.fleet.step('prefill_short');
    const lifecycle = await journal.tail({ type: 'engine.lifecycle', limit: 10, order: 'oldest' });
    expect(lifecycle.map((e) => [e.engine, e.data.state, e.data.by])).toEqual([
      ['prefill-1', 'started', 'planner'],
      ['prefill-1', 'stopped', 'planner'],
    ]);
    expect(lifecycle[1]?.data.reason).toMatch(/^crash loop: 6 exits in 600 s \(last: code 1\)$/);
    expect(Date.now() - started).toBeLessThan(30_000);
    const gaveUp = await journal.tail({ type: 'recovery.action', engine: 'prefill-1', limit: 5 });
    expect(gaveUp.map((e) => e.data.action)).toEqual(['give_up']);
    expect(control.engine('prefill-1')).toBeUndefined();
    expect(stack.engines.ids()).not.toContain('prefill-1');
    // Held: the next step short of prefill starts nothing, and no id is reused.
    await stack.fleet.step('prefill_short');
    expect(stack.engines.ids().sort()).toEqual(['decode-0', 'prefill-0']);
    expect(await journal.tail({ type: 'engine.lifecycle', limit: 10 })).toHaveLength(2);
    // The engines serve started serve on.
    const out = await collect(control.submit({ prompt: 'the lighthouse keeper', maxTokens: 4 }));
    expect(out.error).toBeNull();
  }, 60_000);
});
