/** SIGTERM and the shutdown command drain an engine: its rooms finish, new ones go elsewhere, it exits 0. */
import { describe, expect, it } from 'vitest';
import { RoomEndedError } from '../src/control/intake/streams.ts';
import { collect, prompt, startTestStack, waitFor } from './helpers/stack.ts';
import { tempDir } from './helpers/tmp.ts';

describe('engine drain', () => {
  it('SIGTERM lets a decode engine finish its rooms while new rooms go to the other one', async () => {
    const { control, engines } = await startTestStack({
      decodeEngines: 2,
      restartEngines: false,
      engineArgs: ['--decode-us-per-token', '3000'],
    });
    const first = Array.from({ length: 8 }, (_, i) =>
      control.submit({ prompt: prompt(i, 20), maxTokens: 40 }),
    );
    const outs = Promise.all(first.map(collect));
    await waitFor('rooms decoding on decode-0', () =>
      [...control.liveRooms()].some((r) => r.state === 'decoding' && r.decodeEngine === 'decode-0'),
    );
    const exited = engines.exited('decode-0');
    expect(engines.signal('decode-0', 'SIGTERM')).toBe(true);
    await waitFor(
      'decode-0 reports draining',
      () => control.registry.get('decode-0')?.health.heartbeat?.state === 'draining',
    );
    const later = await collect(control.submit({ prompt: prompt(50, 10), maxTokens: 4 }));
    expect(later.error).toBeNull();
    expect((await control.journal.timeline(later.room)).room?.decodeEngine).toBe('decode-1');
    for (const o of await outs) expect(o.error).toBeNull();
    expect(await exited).toEqual({ code: 0, signal: null });
    const released = await control.journal.tail({
      type: 'room.released',
      engine: 'decode-0',
      limit: 100,
    });
    expect(released.length).toBeGreaterThan(0);
  });

  it('a shutdown command drains the engine and it exits 0 (bus over ipc://)', async () => {
    const { control, engines } = await startTestStack({
      restartEngines: false,
      bus: `ipc://${tempDir('pdctl-ipc-')}/bus.sock`,
    });
    expect(control.endpoint).toMatch(/^ipc:\/\//);
    const exited = engines.exited('prefill-0');
    expect(control.command('prefill-0', 'shutdown', null, 'test')).toBe(true);
    expect(await exited).toEqual({ code: 0, signal: null });
    expect(control.command('nobody', 'drain')).toBe(false);
  });

  it('reset_transfer cancels a stalled transfer in place: the room fails at once and the next one completes', async () => {
    const { control } = await startTestStack({ engineEnv: { PDCTL_TRANSFER_FAULT: 'stall' } });
    const stuck = control.submit({ prompt: prompt(1, 10), maxTokens: 4 });
    const out = collect(stuck);
    await waitFor('room transferring', () => control.room(stuck.room)?.state === 'transferring');
    const t0 = Date.now();
    expect(control.command('prefill-0', 'reset_transfer', null, 'transfer stalled')).toBe(true);
    const o = await out;
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(o.error).toBeInstanceOf(RoomEndedError);
    expect((o.error as RoomEndedError).reason).toBe('transfer_cancelled');
    const next = await collect(control.submit({ prompt: prompt(2, 10), maxTokens: 4 }));
    expect(next.error).toBeNull();
  });

  it('free_room frees a room the engine holds, and the AbortSignal of submit aborts a room', async () => {
    const { control } = await startTestStack({ engineArgs: ['--decode-us-per-token', '5000'] });
    const ac = new AbortController();
    const s = control.submit({ prompt: prompt(4, 10), maxTokens: 200, signal: ac.signal });
    const out = collect(s);
    await waitFor('room decoding', () => control.room(s.room)?.state === 'decoding');
    ac.abort();
    const o = await out;
    expect((o.error as RoomEndedError).state).toBe('aborted');
    expect((o.error as RoomEndedError).reason).toBe('client_disconnect');
    const aborted = (await control.journal.timeline(s.room)).events.find(
      (e) => e.type === 'room.aborted',
    );
    expect(aborted?.data).toEqual({ reason: 'client_disconnect', source: 'client' });

    const held = control.submit({ prompt: prompt(5, 10), maxTokens: 200 });
    void collect(held);
    await waitFor('room decoding', () => control.room(held.room)?.state === 'decoding');
    expect(control.command('decode-0', 'free_room', held.room, 'operator')).toBe(true);
    await waitFor('decode-0 released the room', async () =>
      ((await control.journal.timeline(held.room)).room?.releasedBy ?? []).includes('decode-0'),
    );
    await control.abort(held.room, 'operator', 'test');
  });
});
