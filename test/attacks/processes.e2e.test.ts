/**
 * Engine processes that die or outlive their control plane. A
 * SIGKILLed engine is journaled (`engine.exited`), counted as a restart, and leaves no pool in
 * /dev/shm; engines of a SIGKILLed `pdctl serve` exit on their own; a control plane that did not
 * spawn a surviving engine and was not given its key refuses it, and the engine exits.
 */
import { existsSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { openControlPlane } from '../../src/app/stack.ts';
import { Admission } from '../../src/bus/admission.ts';
import { silentLogger } from '../../src/log.ts';
import { isAlive } from '../../src/pids.ts';
import { KvPool } from '../../src/transfer/pool.ts';
import { type Served, serve } from '../helpers/serve.ts';
import { spawnPdctl } from '../helpers/spawn.ts';
import { collect, prompt, startTestStack, waitFor } from '../helpers/stack.ts';
import { tempDir } from '../helpers/tmp.ts';

const shm = (name: string) => join('/dev/shm', name.replace(/^\//, ''));

describe('engine processes', () => {
  it('a SIGKILLed engine is journaled as exited, counted as a restart, and its pool unlinked', async () => {
    // Decoding 400 tokens takes 2 s: the room is seen decoding, and killed while it does.
    const stack = await startTestStack({ engineArgs: ['--decode-us-per-token', '5000'] });
    const { control, engines } = stack;
    const pid = engines.pid('decode-0') as number;
    const pool = control.registry.get('decode-0')?.pool as string;
    expect(existsSync(shm(pool))).toBe(true);
    const busy = control.submit({ prompt: prompt(2, 10), maxTokens: 400 });
    await waitFor('decoding', () => control.room(busy.room)?.state === 'decoding');
    process.kill(pid, 'SIGKILL');
    await waitFor('engine.exited journaled', async () =>
      (await control.journal.tail({ type: 'engine.exited', engine: 'decode-0' })).some(
        (e) => (e.data as { pid: number }).pid === pid,
      ),
    );
    const [exited] = await control.journal.tail({ type: 'engine.exited', engine: 'decode-0' });
    expect(exited?.data).toMatchObject({
      pid,
      code: null,
      signal: 'SIGKILL',
      rooms: 1,
      restarts: 0,
      expected: false,
    });
    expect(existsSync(shm(pool))).toBe(false);
    await waitFor('a new decode-0', () => {
      const s = control.registry.get('decode-0');
      return s?.delivery.live === true && s.pid !== pid;
    });
    expect(engines.restarts('decode-0')).toBe(1);
    // The stream went on on the new engine.
    expect((await collect(busy)).error).toBeNull();
  });

  it('removes pools of dead engines at start, and never a live one or anything else', async () => {
    // pid_max on Linux is at most 4194304: this pid is not running.
    const ghost = KvPool.create({ name: '/pdctl-ghost-4194301', pages: 1, pageBytes: 4096 });
    ghost.close();
    const mine = KvPool.create({ name: `/pdctl-live-${process.pid}`, pages: 1, pageBytes: 4096 });
    // Named like a dead engine's pool, but not a pool: left alone.
    const other = shm('/pdctl-other-4194302');
    writeFileSync(other, 'not a pool');
    try {
      expect(existsSync(shm(ghost.name))).toBe(true);
      await startTestStack();
      expect(existsSync(shm(ghost.name))).toBe(false);
      expect(existsSync(shm(mine.name))).toBe(true);
      expect(existsSync(other)).toBe(true);
    } finally {
      mine.close();
      KvPool.unlink(mine.name);
      rmSync(other, { force: true });
    }
  });

  it('engines of a SIGKILLed pdctl serve exit on their own and unlink their pools', async () => {
    const s: Served = await serve(['--canary-interval-ms', '0']);
    const body = (await (await fetch(`${s.url}/v1/engines`)).json()) as {
      engines: Array<{ id: string; pid: number; pool: string }>;
    };
    expect(body.engines).toHaveLength(2);
    for (const e of body.engines) expect(isAlive(e.pid)).toBe(true);
    s.child.kill('SIGKILL');
    await waitFor('both engines gone', () => body.engines.every((e) => !isAlive(e.pid)), 5000);
    for (const e of body.engines) expect(existsSync(shm(e.pool)), e.id).toBe(false);
  });

  it('a control plane that was not given a survivor’s key refuses it, and the survivor exits', async () => {
    const dir = tempDir('pdctl-survivor-');
    const first = new Admission();
    const keys = first.issue('decode-9');
    const { control: control1 } = await openControlPlane({
      journalPath: join(dir, 'a.db'),
      durability: 'process',
      admission: first,
      log: silentLogger,
      version: 'test',
    });
    const endpoint = control1.endpoint;
    // An engine started by hand (not a child of any control plane), with its key.
    const engine = spawnPdctl(
      [
        'engine',
        '--role',
        'decode',
        '--id',
        'decode-9',
        '--control',
        endpoint,
        '--log-level',
        'error',
      ],
      { env: { ...process.env, ...first.engineEnv('decode-9') } },
    );
    let stderr = '';
    engine.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<number | null>((r) => engine.once('exit', (code) => r(code)));
    await waitFor(
      'decode-9 registered',
      () => control1.registry.get('decode-9')?.delivery.live === true,
    );
    expect(control1.registry.get('decode-9')?.key).toBe(keys.publicKey);
    await control1.close();
    // The control plane restarts with its own key pair (as serve keeps it in bus.key), but its
    // operator did not allow that engine's key this time.
    const { control: control2 } = await openControlPlane({
      journalPath: join(dir, 'b.db'),
      durability: 'process',
      bus: endpoint,
      admission: new Admission(first.server),
      log: silentLogger,
      version: 'test',
    });
    try {
      expect(await exited).toBe(1);
      expect(stderr).toMatch(/BUS_UNAUTHORIZED.*does not allow this engine’s key/);
      expect(control2.registry.get('decode-9')).toBeUndefined();
      expect(control2.bus.zapDenied).toBeGreaterThan(0);
    } finally {
      await control2.close();
    }
  });
});
