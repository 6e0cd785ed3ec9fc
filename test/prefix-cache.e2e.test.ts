/**
 * The prefix cache end to end (docs/design.md §12): real prefill engine processes keep the KV of
 * prompt blocks they computed, the journal records what they stored and reused, the router sends
 * a request to the engine holding its prefix, and a reused prefix gives exactly the cold text.
 */
import { describe, expect, it } from 'vitest';
import { prefixPerMinute } from '../src/cli/journal/stats.ts';
import { StartState } from '../src/control/checkpoint/state.ts';
import { DeterministicModel, generateInProcess } from '../src/model/deterministic.ts';
import { blockNames } from '../src/model/prefix-blocks.ts';
import type { JournalEventOf } from '../src/room/events.ts';
import { collect, prompt, startTestStack } from './helpers/stack.ts';

const model = new DeterministicModel();

describe('prefix cache and kv routing', () => {
  it('reuses a cached prefix on the engine that holds it, token for token as a cold computation, and the journal says so', async () => {
    const stack = await startTestStack({ prefillEngines: 2, decodeEngines: 1 });
    const { control, journal } = stack;
    // A shared "system prompt" of 200 words (3 full blocks of 64 tokens), then questions.
    const system = prompt(7, 200);
    const asks = [
      'what is the amber kettle',
      'where does the north orbit go',
      'who wove the velvet',
    ];
    const rooms: string[] = [];
    for (const ask of asks) {
      const text = `${system} ${ask}`;
      const out = await collect(control.submit({ prompt: text, maxTokens: 12 }));
      expect(out.error).toBeNull();
      expect(out.text).toBe(generateInProcess(model, text, 12).text);
      rooms.push(out.room);
    }
    const events = async (room: string) => (await journal.timeline(room)).events;
    const created = async (room: string) =>
      (await events(room)).find((e) => e.type === 'room.created') as JournalEventOf<'room.created'>;
    const posted = async (room: string) =>
      (await events(room)).find(
        (e) => e.type === 'room.transfer_posted',
      ) as JournalEventOf<'room.transfer_posted'>;

    const first = await created(rooms[0] as string);
    const names = blockNames(model.tokenize(`${system} ${asks[0]}`), 64);
    expect(names.length).toBeGreaterThanOrEqual(3);
    expect(first.data.prefixBlocks).toBe(names.length);
    expect(first.data.expectedBlocks).toBe(0);
    const cold = await posted(rooms[0] as string);
    expect(cold.data.reusedBlocks).toBe(0);
    expect(cold.data.storedBlocks).toEqual(names);

    const shared = Math.floor(model.tokenize(system).length / 64);
    for (const room of rooms.slice(1)) {
      const c = await created(room);
      // The router sent it to the engine that holds the system prompt's blocks, expecting them…
      expect(c.data.prefillEngine).toBe(first.data.prefillEngine);
      expect(c.data.expectedBlocks).toBe(shared);
      // …and the engine reused them.
      expect((await posted(room)).data.reusedBlocks).toBe(shared);
    }

    // The index a new control plane would rebuild from the journal is the live one.
    const state = new StartState();
    await state.foldJournal(journal, await journal.headSeq());
    const rebuilt = state.index;
    for (const engine of control
      .engines()
      .filter((e) => e.role === 'prefill')
      .map((e) => e.engine)) {
      expect(rebuilt.blocksOn(engine)).toBe(control.router.index.blocksOn(engine));
      expect(rebuilt.overlap(engine, names)).toBe(control.router.index.overlap(engine, names));
    }
    expect(control.router.index.overlap(first.data.prefillEngine, names)).toBe(names.length);

    // `pdctl journal stats --per-minute` reads the same figures from the journal.
    const minutes = await prefixPerMinute(journal, {
      since: Date.now() - 60_000,
      until: Date.now() + 1,
    });
    const sum = (k: 'rooms' | 'blocks' | 'expected' | 'reused') =>
      minutes.reduce((n, m) => n + m[k], 0);
    expect(sum('rooms')).toBe(3);
    expect(sum('reused')).toBe(2 * shared);
    expect(sum('expected')).toBe(2 * shared);
    expect(sum('blocks')).toBe(
      asks.reduce((n, ask) => n + blockNames(model.tokenize(`${system} ${ask}`), 64).length, 0),
    );
  }, 60_000);

  it('gives rooms the pages of cached blocks when the pool is full of them, and says so in the journal', async () => {
    // A prefill pool of 16 pages that the cache may fill entirely: rooms must take pages back.
    const { control, journal } = await startTestStack({
      engineArgs: ['--pages', '16', '--prefix-cache-pages', '16'],
    });
    // Prompts of 2 to 8 pages: the cache keeps their blocks while pages are free, and a larger
    // room later finds fewer free pages than it needs.
    for (let i = 0; i < 8; i++) {
      const text = prompt(100 + i, 100 + 50 * i);
      const out = await collect(control.submit({ prompt: text, maxTokens: 4 }));
      expect(out.error).toBeNull();
      expect(out.text).toBe(generateInProcess(model, text, 4).text);
    }
    const started = await journal.tail({ type: 'room.prefill_started', limit: 100 });
    const evicted = started.flatMap((e) => e.data.evictedBlocks ?? []);
    expect(evicted.length).toBeGreaterThan(0);
    // What was evicted left the index; the engine holds at most what its pool does.
    const prefill = control.engines().find((e) => e.role === 'prefill')?.engine as string;
    for (const name of evicted.slice(-3))
      expect(control.router.index.holds(prefill, name)).toBe(false);
    expect(control.router.index.blocksOn(prefill)).toBeLessThanOrEqual(16);
  }, 60_000);
});
