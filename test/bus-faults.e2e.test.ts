/**
 * No message can kill a loop (docs/design.md §5, docs/incident.md): garbage of every shape from a raw
 * ZeroMQ socket while rooms flow, and protocol misuse from a registered peer. Nothing dies,
 * counters rise, rooms keep completing, and duplicates are stored once.
 */
import { encode } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import * as zmq from 'zeromq';
import { type Admission, newKeyPair } from '../src/bus/admission.ts';
import { hostileFrames } from '../src/bus/hostile.ts';
import { controlFrames } from '../src/bus/protocol.ts';
import { RawEngine } from '../src/drills/raw-engine.ts';
import { collect, poolsFull, prompt, startTestStack, waitFor } from './helpers/stack.ts';

const sockets: zmq.Dealer[] = [];
const raws: RawEngine[] = [];
/** A raw socket with a key the control plane allows: CURVE lets it in, and it may send anything. */
function rawPeer(endpoint: string, admission: Admission): zmq.Dealer {
  const keys = newKeyPair();
  admission.allow('garbage-peer', keys.publicKey);
  const s = new zmq.Dealer({ linger: 0 });
  s.curveServerKey = admission.server.publicKey;
  s.curvePublicKey = keys.publicKey;
  s.curveSecretKey = keys.secretKey;
  s.connect(endpoint);
  sockets.push(s);
  return s;
}

describe('malformed and hostile bus traffic', () => {
  it('drops and counts garbage of every shape while 40 rooms complete', async () => {
    const { control, admission } = await startTestStack();
    const bus = control.bus;
    const ticksBefore = bus.loop.ticks;
    const rooms = Array.from({ length: 40 }, (_, i) =>
      collect(control.submit({ prompt: prompt(i, 30), maxTokens: 8 })),
    );
    const raw = rawPeer(control.endpoint, admission);
    const garbage = hostileFrames(300);
    for (const msg of garbage) await raw.send(msg);
    const outs = await Promise.all(rooms);
    for (const o of outs) expect(o.error).toBeNull();
    await waitFor(
      'every garbage frame counted',
      () => bus.loop.ticks - ticksBefore >= garbage.length,
    );
    for (const reason of [
      'bad_frame_count',
      'unknown_kind',
      'bad_msgpack',
      'bad_payload',
      'not_registered',
      'too_large',
    ] as const) {
      expect(bus.drops.get(reason), reason).toBeGreaterThan(0);
    }
    expect(bus.loop.stats()).toMatchObject({ restarts: 0, running: true });
    // The raw peer was told what was wrong with its appends.
    const decoder = controlFrames();
    const replies = decoder.decodeAll(await raw.receive());
    expect(replies[0]).toMatchObject({ ok: true, kind: 'nack' });
    // And the stack still serves.
    const after = await collect(control.submit({ prompt: prompt(5, 12), maxTokens: 4 }));
    expect(after.error).toBeNull();
    const done = Date.now();
    await waitFor('pools back to capacity', () => poolsFull(control, done));
    for (const s of sockets.splice(0)) s.close();
  });

  it('nacks appends a peer may not make, and stores a retried append once', async () => {
    const { control, admission } = await startTestStack({ prefillEngines: 0, decodeEngines: 0 });
    const keys = newKeyPair();
    admission.allow('fake-d', keys.publicKey);
    const created = await control.journal.append({
      type: 'room.created',
      room: 'r-fake-1',
      source: 'test',
      data: { prefillEngine: 'fake-p', decodeEngine: 'fake-d', promptTokens: 3, maxTokens: 2 },
    });
    const raw = new RawEngine({
      endpoint: control.endpoint,
      engine: 'fake-d',
      role: 'decode',
      incarnation: '1',
      keys,
      serverKey: admission.server.publicKey,
    });
    raws.push(raw);
    const peer = raw.socket;
    const recv = () => raw.next();
    const welcome = await raw.join();
    expect(welcome).toMatchObject({ ok: true, kind: 'welcome', payload: { replayEvents: 1 } });
    const session = raw.session;
    // Replay: the room it was given before it said hello.
    expect(await recv()).toMatchObject({
      ok: true,
      kind: 'event',
      payload: { event: { seq: created.seq, type: 'room.created' } },
    });

    let n = 0;
    const append = (eventId: string, type: string, room: string, s = session, data = {}) =>
      peer.send(['append', encode({ eventId, session: s, n: ++n, event: { type, room, data } })]);
    await append('dup-1', 'room.bootstrap_started', 'r-fake-1');
    await append('dup-1', 'room.bootstrap_started', 'r-fake-1');
    await append('no-1', 'room.created', 'r-fake-2');
    await append('no-2', 'engine.lost', 'r-fake-1');
    // Its own type, without the data the type needs: refused where it comes off the bus.
    await append('no-3', 'room.bootstrapped', 'r-fake-1');
    // Its pages in another engine's pool, at an epoch not its own: not so, and not journaled.
    await append('no-4', 'room.bootstrapped', 'r-fake-1', session, {
      pages: [0],
      pool: '/another-engines-pool',
      epoch: 99,
    });
    const got = new Map<string, Array<Record<string, unknown>>>();
    await waitFor('six replies', async () => {
      const d = await recv();
      if (d.ok) got.set(d.kind, [...(got.get(d.kind) ?? []), d.payload]);
      return (got.get('ack')?.length ?? 0) + (got.get('nack')?.length ?? 0) >= 6;
    });
    const acks = got.get('ack') ?? [];
    expect(acks.map((a) => a.status)).toEqual(['applied', 'duplicate']);
    expect(acks[1]?.original).toBe('applied');
    expect(acks[0]?.seq).toBe(acks[1]?.seq);
    expect((got.get('nack') ?? []).map((n) => n.code)).toEqual([
      'BUS_INVALID_EVENT',
      'BUS_INVALID_EVENT',
      'BUS_INVALID_EVENT',
      'BUS_INVALID_EVENT',
    ]);
    expect(got.get('nack')?.[2]?.message).toMatch(/^room\.bootstrapped: data\.pages /);
    expect(got.get('nack')?.[3]?.message).toMatch(
      /^room\.bootstrapped of r-fake-1 names pool \/another-engines-pool epoch 99, but fake-d registered pool \S+ epoch \d+$/,
    );
    // The committed event reached the engine as an `event`, once.
    expect(
      (got.get('event') ?? []).filter(
        (e) => (e.event as { type: string }).type === 'room.bootstrap_started',
      ),
    ).toHaveLength(1);
    const timeline = await control.journal.timeline('r-fake-1');
    expect(timeline.events.map((e) => e.type)).toEqual(['room.created', 'room.bootstrap_started']);
    // An append under another session (one left in a dead connection) is dropped; a gap in the
    // numbering ends the session.
    await append('old-1', 'room.bootstrapped', 'r-fake-1', session + 1);
    await waitFor('stale append counted', () => control.bus.drops.get('stale_session') === 1);
    n++; // one number never arrives
    await append('gap-1', 'room.bootstrapped', 'r-fake-1');
    const gap = await recv();
    expect(gap).toMatchObject({
      ok: true,
      kind: 'nack',
      payload: { code: 'BUS_NOT_REGISTERED', retryable: true },
    });
    expect(control.bus.drops.get('out_of_order')).toBe(1);
    expect((await control.journal.timeline('r-fake-1')).events).toHaveLength(2);
    // Tokens for a room that has not reached decode (here: nobody streams it either) are
    // counted, not forwarded.
    const refused = control.bus.drops.get('not_owner');
    await peer.send(['tokens', encode({ room: 'r-fake-1', index: 0, text: ' x', tokens: 1 })]);
    await waitFor('tokens counted', () => control.bus.drops.get('not_owner') === refused + 1);
    expect(control.counters.tokens).toBe(0);
    for (const r of raws.splice(0)) r.close();
  });
});
