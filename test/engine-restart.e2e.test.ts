/**
 * Engines that die or lose the control plane: no room goes to a SIGKILLed engine while it
 * restarts, a request fails cleanly past `pdctl serve --migration-limit`, and an engine cut off for seconds
 * (a real TCP proxy, CURVE) reconnects, catches up, and nothing is applied or stored twice.
 *
 * A SIGKILLed engine's live streams migrating to its replacement and ending as if undisturbed is
 * `pdctl drill kill-prefill` and `kill-decode` with real processes (test/drill.e2e.test.ts), and
 * the simulator's kill seeds (src/sim/run.unit.test.ts): its variants moved there (issue 41).
 */
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { openControlPlane } from '../src/app/stack.ts';
import { Admission } from '../src/bus/admission.ts';
import { silentLogger } from '../src/log.ts';
import { DeterministicModel, generateInProcess } from '../src/model/deterministic.ts';
import { EngineSupervisor } from '../src/recovery/supervisor.ts';
import { complete, serve } from './helpers/serve.ts';
import {
  collect,
  isHappyPath,
  poolsFull,
  prompt,
  startTestStack,
  waitFor,
} from './helpers/stack.ts';
import { TcpProxy } from './helpers/tcp-proxy.ts';
import { tempDir } from './helpers/tmp.ts';

const cleanups: Array<() => Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

describe('engine restarts and lost connections', () => {
  it('no new room goes to an engine whose process is gone, while it restarts', async () => {
    const { control, engines, journal } = await startTestStack({ decodeEngines: 2 });
    const dead = control.registry.get('decode-0')?.incarnation;
    expect(engines.signal('decode-0', 'SIGKILL')).toBe(true);
    await waitFor('decode-0 exit journaled', async () => {
      const exited = await journal.tail({ type: 'engine.exited', engine: 'decode-0' });
      return exited.length > 0;
    });
    // decode-0 is the least loaded and its last heartbeat is still fresh: before the fix, every
    // one of these went to it and had to be moved when it came back.
    const streams = Array.from({ length: 10 }, (_, i) =>
      control.submit({ prompt: prompt(i, 10), maxTokens: 4 }),
    );
    for (const o of await Promise.all(streams.map(collect))) expect(o.error).toBeNull();
    for (const s of streams) {
      const t = await journal.timeline(s.room);
      expect(t.room?.state).toBe('completed');
      if (t.room?.decodeEngine === 'decode-0')
        expect(control.registry.get('decode-0')?.incarnation).not.toBe(dead);
    }
  });

  it('a request whose engines die more often than pdctl serve --migration-limit fails cleanly', async () => {
    const s = await serve([
      ...['--migration-limit', '1', '--decode-us-per-token', '4000'],
      ...['--canary-interval-ms', '0'],
    ]);
    try {
      const get = async <T>(path: string) => (await (await fetch(`${s.url}${path}`)).json()) as T;
      const decodePid = async () =>
        (await get<{ engines: Array<{ id: string; pid: number }> }>('/v1/engines')).engines.find(
          (e) => e.id === 'decode-0',
        )?.pid;
      const decoding = async (migrated: boolean) =>
        (
          await get<{ rooms: Array<{ migratedFrom: string | null }> }>('/v1/rooms?state=decoding')
        ).rooms.some((r) => (r.migratedFrom !== null) === migrated);
      const answers = Promise.all(
        Array.from({ length: 6 }, (_, i) => complete(s.url, prompt(i, 20), 120)),
      );
      await waitFor('rooms decoding', () => decoding(false));
      const first = (await decodePid()) as number;
      process.kill(first, 'SIGKILL');
      await waitFor('migrated rooms decoding on the replacement', () => decoding(true), 20_000);
      const second = (await decodePid()) as number;
      expect(second).not.toBe(first);
      process.kill(second, 'SIGKILL');
      // Moved once already, a room whose engine dies again fails, its client told why.
      const limited = (await answers).filter((a) => a.status !== 200);
      expect(limited.length).toBeGreaterThan(0);
      for (const a of limited) expect(a.body.error?.message).toMatch(/migration_limit_reached/);
      const failed = await get<{ rooms: Array<{ migratedFrom: string | null }> }>(
        '/v1/rooms?reason=migration_limit_reached&limit=100',
      );
      expect(failed.rooms.length).toBe(limited.length);
      for (const r of failed.rooms) expect(r.migratedFrom).not.toBeNull();
    } finally {
      expect(await s.stop()).toBe(0);
    }
  });

  it('an engine cut off for 3 s reconnects, catches up, and nothing is stored or applied twice', async () => {
    const dir = tempDir('pdctl-partition-');
    const admission = new Admission();
    const { control } = await openControlPlane({
      journalPath: join(dir, 'journal.db'),
      durability: 'process',
      admission,
      log: silentLogger,
      version: 'test',
    });
    cleanups.push(() => control.close());
    const proxy = await TcpProxy.start(control.endpoint);
    cleanups.push(() => proxy.close());
    const records: Array<Record<string, unknown>> = [];
    const engines = new EngineSupervisor({
      control: proxy.endpoint,
      admission,
      curve: true,
      log: { ...silentLogger, info: (obj, msg) => records.push({ ...obj, msg }) },
      logLevel: 'error',
    });
    cleanups.push(() => engines.stop());
    engines.start({ id: 'prefill-0', role: 'prefill', args: [] });
    engines.start({ id: 'decode-0', role: 'decode', args: ['--decode-us-per-token', '1500'] });
    await control.waitForEngines(1, 1, 30_000);
    // The engine's pid is its own field: a JSON record's `pid` is the logging process's (pino's
    // base), and a second `pid` key in one record is lost by most parsers.
    const started = records.filter((r) => r.msg === 'engine process started');
    expect(started.map((r) => typeof r.enginePid)).toEqual(['number', 'number']);
    expect(started.filter((r) => 'pid' in r)).toEqual([]);

    const model = new DeterministicModel();
    const requests = Array.from({ length: 30 }, (_, i) => ({
      prompt: prompt(i, 25),
      maxTokens: 60,
    }));
    const streams = requests.map((r) => control.submit(r));
    const outs = Promise.all(streams.map(collect));
    await waitFor('rooms decoding', () =>
      [...control.liveRooms()].some((r) => r.state === 'decoding'),
    );
    const hellos = control.counters.hellos;
    proxy.cut();
    await new Promise((r) => setTimeout(r, 3000));
    proxy.restore();
    const results = await outs;
    expect(control.counters.hellos).toBeGreaterThan(hellos);
    for (const [i, o] of results.entries()) {
      const r = requests[i] as (typeof requests)[number];
      expect(o.error).toBeNull();
      expect(o.text).toBe(generateInProcess(model, r.prompt, r.maxTokens).text);
    }
    const done = Date.now();
    await waitFor('pools back to capacity', () => poolsFull(control, done));
    // Same incarnations: a reconnect, not a restart.
    expect(await control.journal.tail({ type: 'engine.registered', limit: 10 })).toHaveLength(2);
    const stats = await control.journal.stats();
    expect(stats.rejectedEvents).toBe(0);
    for (const s of streams) {
      const types = (await control.journal.timeline(s.room)).events.map((e) => e.type);
      expect(isHappyPath(types), types.join(' ')).toBe(true);
    }
    expect((await control.journal.verify()).ok).toBe(true);
  });
});
