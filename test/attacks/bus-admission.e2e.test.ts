/**
 * The bus admits only engines that prove who they are (docs/security.md). Each
 * attack is played against a real stack (CURVE on, as `pdctl serve` runs by default) by a peer on a real
 * ZeroMQ socket, and the stack keeps serving its clients throughout.
 */
import { describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';
import { newKeyPair } from '../../src/bus/admission.ts';
import type { Reply } from '../../src/drills/raw-engine.ts';
import { closeAfterTest, raw } from '../helpers/raw-peers.ts';
import { collect, prompt, startTestStack, waitFor } from '../helpers/stack.ts';

function payload(r: Reply): Record<string, unknown> {
  if (!r.ok) throw new Error(`undecodable reply: ${r.reason}`);
  return r.payload;
}

describe('bus admission', () => {
  it('a peer without an allowed CURVE key never reaches the control plane', async () => {
    const { control, admission } = await startTestStack();
    // No CURVE at all: the handshake fails before any frame is read.
    const plain = new zmq.Dealer({ linger: 0 });
    closeAfterTest(plain);
    plain.connect(control.endpoint);
    await plain.send(['hello', Buffer.from('x')]);
    // CURVE with a key nobody allowed: refused by the ZAP handler, even with a valid signature.
    const rogue = raw({
      endpoint: control.endpoint,
      engine: 'decode-0',
      role: 'decode',
      keys: newKeyPair(),
      serverKey: admission.server.publicKey,
    });
    await rogue.sayHello();
    await waitFor('the rogue key refused', () => control.bus.zapDenied > 0);
    await expect(rogue.next(undefined, 1000)).rejects.toThrow(/no reply/);
    // Neither hello reached admission (which would have counted it as unauthorized), and no
    // engine but the stack's own is known. (The real engines may say hello again meanwhile.)
    expect(control.bus.drops.get('unauthorized')).toBe(0);
    expect(
      control.registry
        .all()
        .map((s) => s.engine)
        .sort(),
    ).toEqual(['decode-0', 'prefill-0']);
    const ok = await collect(control.submit({ prompt: prompt(1, 10), maxTokens: 4 }));
    expect(ok.error).toBeNull();
  });

  it('an allowed key cannot speak for another engine, take over an incarnation, or forge a proof', async () => {
    const { control, admission } = await startTestStack();
    const decode = control.registry.get('decode-0');
    const incarnation = decode?.incarnation;
    expect(incarnation).toBeTruthy();
    const serverKey = admission.server.publicKey;
    // The prefill engine's own key pair, stolen: CURVE lets it in, admission does not.
    const stolen = admission.issue('prefill-0');
    const asDecode = raw({
      endpoint: control.endpoint,
      engine: 'decode-0',
      role: 'decode',
      keys: stolen,
      serverKey,
    });
    await asDecode.sayHello();
    expect(payload(await asDecode.next('nack'))).toMatchObject({
      code: 'BUS_UNAUTHORIZED',
      retryable: false,
      message: expect.stringContaining('may not speak for engine decode-0'),
    });
    // A hello for decode-0 signed with a key it does not hold: the proof does not verify.
    const forged = raw({
      endpoint: control.endpoint,
      engine: 'decode-0',
      role: 'decode',
      keys: stolen,
      serverKey,
    });
    const real = admission.issue('decode-0').publicKey;
    await forged.sayHello({
      auth: { ...(forged.hello().auth as object), key: real },
    });
    expect(payload(await forged.next('nack'))).toMatchObject({
      code: 'BUS_UNAUTHORIZED',
      message: expect.stringContaining('does not verify'),
    });
    // No hello at all.
    const bare = raw({
      endpoint: control.endpoint,
      engine: 'x-9',
      role: 'decode',
      keys: stolen,
      serverKey,
    });
    await bare.sayHello({ auth: undefined });
    expect(payload(await bare.next('nack'))).toMatchObject({
      code: 'BUS_UNAUTHORIZED',
      message: expect.stringContaining('no admission proof'),
    });
    // 61 forged hellos in a burst: refused, or (past the connection's hello quota) dropped
    // unread; the real decode-0 keeps its registration and serves.
    for (let i = 0; i < 61; i++) await asDecode.sayHello();
    await waitFor(
      'every forged hello refused',
      () => control.bus.drops.get('unauthorized') + control.bus.drops.get('rate_limited') >= 63,
    );
    expect(control.bus.drops.get('rate_limited')).toBeGreaterThan(0);
    expect(control.registry.get('decode-0')?.incarnation).toBe(incarnation);
    expect(
      control.registry
        .all()
        .map((s) => s.engine)
        .sort(),
    ).toEqual(['decode-0', 'prefill-0']);
    const outs = await Promise.all(
      Array.from({ length: 4 }, (_, i) =>
        collect(control.submit({ prompt: prompt(i, 12), maxTokens: 6 })),
      ),
    );
    for (const o of outs) expect(o.error).toBeNull();
    const registered = await control.journal.tail({ type: 'engine.registered', limit: 100 });
    expect(registered.map((e) => e.engine).sort()).toEqual(['decode-0', 'prefill-0']);
  });

  it('an admitted engine cannot touch rooms it does not hold, nor occupy the control plane’s event ids', async () => {
    const { control, admission } = await startTestStack({
      // 2000 tokens at 5 ms: the room decodes for 10 s, held open while the guest tries its appends.
      engineArgs: ['--decode-us-per-token', '5000'],
    });
    const keys = newKeyPair();
    admission.allow('guest-d', keys.publicKey);
    const guest = raw({
      endpoint: control.endpoint,
      engine: 'guest-d',
      role: 'decode',
      keys,
      serverKey: admission.server.publicKey,
    });
    await guest.join();
    // A live room of the real engines, held open by a long generation.
    const stream = control.submit({ prompt: prompt(3, 20), maxTokens: 2000 });
    const room = stream.room;
    // Decoding, and released by its prefill engine: nothing more of it is journaled until it ends.
    await waitFor('the room decoding, its prefill engine done with it', () => {
      const r = control.room(room);
      return r?.state === 'decoding' && r.releasedBy.includes(r.prefillEngine);
    });
    const head = await control.journal.headSeq();
    // The ids the control plane will use to abort or fail this room.
    for (const id of [`${room}:aborted`, `${room}:orphaned`, `${room}:deadline:decoding`])
      await guest.append(id, 'room.completed', room, { tokens: 1, finishReason: 'stop' });
    await guest.append('x1', 'room.failed', 'r-nobody-1', {
      reason: 'junk',
      stage: 'decoding',
      detectedBy: 'guest',
    });
    // A type its role never sends.
    await guest.append('x2', 'room.transfer_posted', room, {});
    const nacks: Array<Record<string, unknown>> = [];
    for (let i = 0; i < 5; i++) nacks.push(payload(await guest.next('nack')));
    expect(nacks.map((n) => n.code)).toEqual(Array(5).fill('BUS_INVALID_EVENT'));
    expect(nacks[0]?.message).toContain('belongs to prefill-0 (prefill) and decode-0 (decode)');
    expect(nacks[3]?.message).toContain('not a room this control plane gave to guest-d');
    expect(nacks[4]?.message).toContain('a decode engine may not append room.transfer_posted');
    // Nothing was journaled for any of it.
    expect(await control.journal.headSeq()).toBe(head);
    expect(control.bus.drops.get('not_owner')).toBe(5);
    // The control plane's abort of that room still works: its id was never taken.
    const res = await control.abort(room, 'operator', 'admin');
    expect(res.status).toBe('applied');
    const out = await collect(stream);
    expect(out.error).not.toBeNull();
    await waitFor(
      'the room aborted',
      async () => (await control.journal.timeline(room)).room?.state === 'aborted',
    );
  });
});
