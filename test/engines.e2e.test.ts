/**
 * Rooms end to end through real engine processes, the real bus and the real journal: completions
 * equal the model run in-process, timelines follow the state table, pools return to capacity.
 */
import { describe, expect, it } from 'vitest';
import type { EngineSession } from '../src/control/engines/engine-session.ts';
import { DeterministicModel, generateInProcess } from '../src/model/deterministic.ts';
import {
  collect,
  isHappyPath,
  poolsFull,
  prompt,
  startTestStack,
  waitFor,
} from './helpers/stack.ts';

describe('engines end to end', () => {
  it("under load, an engine's back-to-back appends are judged after its earlier ones, never refused as out of order", async () => {
    // A prefill engine sends room.prefill_started and room.transfer_posted back to back; the
    // second used to be judged against a view that had not folded the first yet, counted as an
    // out-of-order event, and once 500 of those had been counted, refused (rooms then stalled
    // for seconds). 1,200 short rooms, 32 at a time, make several thousand such pairs.
    const { control } = await startTestStack();
    let next = 0;
    let failed = 0;
    const worker = async () => {
      while (next < 1200) {
        const i = next++;
        const out = await collect(control.submit({ prompt: prompt(i, 8), maxTokens: 2 }));
        if (out.error) failed++;
      }
    };
    await Promise.all(Array.from({ length: 32 }, worker));
    expect(failed).toBe(0);
    expect(control.busStatus().dropped.rate_limited ?? 0).toBe(0);
  }, 120_000);

  it('completes 200 rooms across 2 prefill and 2 decode engines exactly as the model does in-process', async () => {
    const stack = await startTestStack({
      prefillEngines: 2,
      decodeEngines: 2,
      engineArgs: ['--pages', '2048'],
    });
    const { control } = stack;
    const model = new DeterministicModel();
    // Prompts from 1 to ~300 words: one page holds 64 tokens, so many rooms span several pages.
    const requests = Array.from({ length: 200 }, (_, i) => ({
      prompt: prompt(i, 1 + ((i * 37) % 300)),
      maxTokens: 1 + ((i * 13) % 40),
    }));
    const streams = requests.map((r) => control.submit(r));
    const outputs = await Promise.all(streams.map(collect));

    for (const [i, out] of outputs.entries()) {
      const r = requests[i] as (typeof requests)[number];
      expect(out.error).toBeNull();
      expect(out.text).toBe(generateInProcess(model, r.prompt, r.maxTokens).text);
      const result = await (streams[i] as (typeof streams)[number]).result;
      expect(result.tokens).toBe(r.maxTokens);
      expect(result.text).toBe(out.text);
    }

    // Decode engines release a room once its completion is committed, just after the stream ends.
    const done = Date.now();
    await waitFor('every pool back to capacity', () => poolsFull(control, done));
    const journal = control.journal;
    const report = await journal.verify();
    expect(report.ok, JSON.stringify(report.problems)).toBe(true);
    const used = { prefill: new Set<string>(), decode: new Set<string>() };
    for (const out of outputs) {
      const t = await journal.timeline(out.room);
      const types = t.events.map((e) => e.type);
      expect(isHappyPath(types), types.join(' ')).toBe(true);
      expect(t.room?.state).toBe('completed');
      expect(new Set(t.room?.releasedBy)).toEqual(
        new Set([t.room?.prefillEngine, t.room?.decodeEngine]),
      );
      used.prefill.add(t.room?.prefillEngine as string);
      used.decode.add(t.room?.decodeEngine as string);
    }
    expect(used.prefill.size).toBe(2);
    expect(used.decode.size).toBe(2);
    // Protocol 9: every first token is behind one commit, room.created: the prefill engine it
    // names draws it.
    const depths = control.book.firstTokenCommits();
    expect(depths[1]).toBeGreaterThanOrEqual(200);
    expect(depths.reduce((a, b) => a + b, 0)).toBe(depths[1]);
    // The control plane's page map agreed with both decode engines, and holds nothing now.
    expect(control.book.pageConflicts).toBe(0);
    for (const engine of used.decode) expect(control.book.decodePagesOn(engine)).toBe(0);
    expect((await journal.stats()).rejectedEvents).toBe(0);
    expect(control.bus.drops.snapshot()).toEqual({});
  });

  it('refuses a room no pool can hold before journaling it, and an engine that cannot hold one fails it cleanly', async () => {
    const stack = await startTestStack({ engineArgs: ['--pages', '4'] });
    const { control } = stack;
    const head = await control.journal.headSeq();
    expect(() => control.submit({ prompt: prompt(1, 400), maxTokens: 10 })).toThrow(
      /needs 400 prompt tokens of KV, 7 pages, but the largest prefill KV pool has 4 pages/,
    );
    expect(await control.journal.headSeq()).toBe(head);
    // An engine that does not say how its KV takes pages (another implementation, say) is not
    // counted at admission: its own allocator refuses the room, and the room fails cleanly.
    for (const s of control.registry.all()) (s as { kv: EngineSession['kv'] }).kv = null;
    const out = await collect(control.submit({ prompt: prompt(1, 400), maxTokens: 10 }));
    expect(out.error?.message).toMatch(/failed: kv_pool_full \(in bootstrapping\)/);
    const t = await control.journal.timeline(out.room);
    expect(t.room?.state).toBe('failed');
    expect(t.room?.detectedBy).toBe('engine:decode-0');
    const ok = await collect(control.submit({ prompt: prompt(2, 20), maxTokens: 5 }));
    expect(ok.error).toBeNull();
    const done = Date.now();
    await waitFor('every pool back to capacity', () => poolsFull(control, done));
  });
});
