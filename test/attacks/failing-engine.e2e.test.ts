/**
 * Issue 40, item 2, played as an admitted engine that fails every room would: prefill-1 corrupts
 * every KV transfer it makes. Each of its rooms fails before its first token, is tried again on a
 * pair without it, and every client gets one whole answer; prefill-1 is ejected and the next
 * requests all go to prefill-0. With the retry and the ejection off (`pdctl serve --retry-limit 0
 * --no-outlier-ejection`), the failures reach the clients and prefill-1 stays in rotation.
 */
import { describe, expect, it } from 'vitest';
import { DeterministicModel, generateInProcess } from '../../src/model/deterministic.ts';
import { complete, serve } from '../helpers/serve.ts';
import { collect, committed, prompt, startTestStack, waitFor } from '../helpers/stack.ts';

describe('a room that fails before its first token', () => {
  it('is tried again on another pair, the engine to blame left out: every client gets one whole answer, and the journal links the rooms', async () => {
    const { control } = await startTestStack({
      prefillEngines: 2,
      engineArgs: ['--allow-fault-injection'],
    });
    // Every transfer prefill-1 makes arrives corrupted: each of its rooms fails kv_checksum_mismatch.
    expect(control.command('prefill-1', 'inject_fault', null, 'corrupt')).toBe(true);
    await new Promise((r) => setTimeout(r, 200));
    const requests = Array.from({ length: 16 }, (_, i) => ({
      prompt: prompt(700 + i, 12),
      maxTokens: 6,
    }));
    const streams = requests.map((r) => control.submit(r));
    const outs = await Promise.all(streams.map(collect));
    const model = new DeterministicModel();
    for (const [i, o] of outs.entries()) {
      const r = requests[i] as (typeof requests)[number];
      expect(o.error).toBeNull();
      expect(o.text).toBe(generateInProcess(model, r.prompt, r.maxTokens).text);
    }
    const created = await control.journal.tail({ type: 'room.created', limit: 100 });
    const retried = created.filter((e) => e.data.retriedFrom !== undefined);
    expect(retried.length).toBeGreaterThan(0);
    for (const e of retried) {
      const failed = await control.journal.timeline(e.data.retriedFrom as string);
      expect(failed.room).toMatchObject({ state: 'failed', reason: 'kv_checksum_mismatch' });
      expect(failed.room?.prefillEngine).toBe('prefill-1');
      // A fault of the pair: the retry left one of its engines out (the only decode engine stays).
      expect(e.data.prefillEngine).toBe('prefill-0');
      expect(e.data.decodeEngine).toBe('decode-0');
      expect(e.source).toBe('retry');
    }
    const actions = await control.journal.tail({ type: 'recovery.action', limit: 100 });
    expect(actions.filter((a) => a.data.action === 'retry_room')).toHaveLength(retried.length);
    // Each request took one room or two: a retried one is never tried a second time.
    expect(created.length).toBe(requests.length + retried.length);
    // Its rooms failing far more often than prefill-0's, prefill-1 is out of rotation: the next
    // requests all go to prefill-0 (decode-0, the only decode engine, is never ejected).
    // The registry takes it out of rotation at once; the journal says so once its commit lands.
    await waitFor('prefill-1 ejected', () => control.registry.ejections.has('prefill-1'));
    const ejected = await committed(control.journal, { type: 'engine.ejected' });
    expect(ejected).toMatchObject({ engine: 'prefill-1', data: { peersFailureRate: 0 } });
    expect(control.registry.ejections.has('decode-0')).toBe(false);
    const head = await control.journal.headSeq();
    const later = await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        collect(control.submit({ prompt: prompt(750 + i, 12), maxTokens: 6 })),
      ),
    );
    for (const o of later) expect(o.error).toBeNull();
    const after = await control.journal.tail({ type: 'room.created', afterSeq: head, limit: 100 });
    expect(after.filter((e) => e.source !== 'canary').map((e) => e.data.prefillEngine)).toEqual(
      Array(6).fill('prefill-0'),
    );
  });

  it('reaches its client as the failure it was under pdctl serve --retry-limit 0 --no-outlier-ejection, and the engine stays in rotation', async () => {
    // Round robin: half of a burst goes to prefill-1. The decode engine, which finds the corrupt
    // bytes, is held (SIGSTOP) until the whole burst has its rooms: after the first failure the
    // pair is avoided a while, and a burst that reached the server slowly would mostly go to
    // prefill-0.
    const s = await serve([
      ...['--prefill', '2', '--allow-fault-injection', '--canary-interval-ms', '0'],
      ...['--retry-limit', '0', '--no-outlier-ejection', '--router', 'round-robin'],
    ]);
    try {
      const inject = await fetch(`${s.url}/v1/admin/engines/prefill-1/commands`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ command: 'inject_fault', reason: 'corrupt' }),
      });
      expect(inject.status).toBe(202);
      await new Promise((r) => setTimeout(r, 200));
      // At least as many failures as the detector needs to eject (5 of its rooms), with the
      // ejection on: 16 at once, 8 of them through prefill-1.
      const listed = (await (await fetch(`${s.url}/v1/engines`)).json()) as {
        engines: Array<{ id: string; pid: number }>;
      };
      const decode = listed.engines.find((e) => e.id === 'decode-0')?.pid as number;
      const rooms = async () =>
        (await (await fetch(`${s.url}/v1/journal?type=room.created`)).text())
          .split('\n')
          .filter((l) => l !== '').length;
      process.kill(decode, 'SIGSTOP');
      let pending: Promise<Awaited<ReturnType<typeof complete>>[]>;
      try {
        pending = Promise.all(
          Array.from({ length: 16 }, (_, i) => complete(s.url, prompt(800 + i, 12), 6)),
        );
        await waitFor('the burst’s 16 rooms', async () => (await rooms()) >= 16);
      } finally {
        process.kill(decode, 'SIGCONT');
      }
      const answers = await pending;
      // --retry-limit 0: a room that failed before its first token is not tried again.
      const failed = answers.filter((a) => a.status !== 200);
      expect(failed.length).toBeGreaterThanOrEqual(5);
      for (const a of failed) expect(a.body.error?.message).toMatch(/kv_checksum_mismatch/);
      const journal = async (type: string) =>
        (await (await fetch(`${s.url}/v1/journal?type=${type}`)).text())
          .split('\n')
          .filter((l) => l !== '')
          .map((l) => JSON.parse(l) as { engine: string | null; data: Record<string, unknown> });
      expect((await journal('room.created')).filter((e) => 'retriedFrom' in e.data)).toEqual([]);
      // --no-outlier-ejection: prefill-1 failed more often than its peer, and stays in rotation
      // (the detector looks every 250 ms; a second is four looks).
      const failures = (await journal('room.failed')).length;
      expect(failures).toBeGreaterThanOrEqual(5);
      await new Promise((r) => setTimeout(r, 1000));
      expect(await journal('engine.ejected')).toEqual([]);
    } finally {
      expect(await s.stop()).toBe(0);
    }
  });
});
