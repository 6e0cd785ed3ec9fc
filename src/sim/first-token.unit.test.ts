/**
 * The first token comes from the prefill engine (protocol 9), ahead of the KV's transfer: a
 * client that has it must read the answer on from it unbroken, whichever engine of the pair dies
 * next. Played in the simulated fleet, at the moment the client holds only the first token.
 */
import { describe, expect, it } from 'vitest';
import { usageOf } from '../journal/usage.ts';
import { DeterministicModel, generateInProcess } from '../model/deterministic.ts';
import { Fleet } from './fleet.ts';

const PROMPT = 'the harbor keeps its lights on for the boats that come in late';
const MAX_TOKENS = 12;

/** The fleet, a streaming request, and the first chunk its client read (and its room then). */
async function atFirstToken(fault: 'stall' | 'corrupt' | null) {
  const fleet = await Fleet.start({ seed: 5 });
  const prefills = [...fleet.engines.values()].filter((e) => e.role === 'prefill');
  // `stall`: no transfer completes until the test says so, so the client reads the first token
  // while the KV has not moved; `corrupt`: every transfer arrives with other bytes than sent.
  if (fault) for (const e of prefills) e.transfer?.inject({ kind: fault });
  const stream = fleet.control.submit({
    prompt: PROMPT,
    maxTokens: MAX_TOKENS,
    requestId: 'req-1',
  });
  const chunks = stream[Symbol.asyncIterator]();
  const first = await fleet.clock.runUntil(chunks.next());
  if (first.done) throw new Error('the stream ended before its first chunk');
  const room = fleet.disk.rooms.get(first.value.room);
  if (!room) throw new Error(`room ${first.value.room} is not in the journal`);
  /** The rest of the answer, read to its end. */
  const rest = async () => {
    let text = first.value.text;
    for (let c = await fleet.clock.runUntil(chunks.next()); !c.done; ) {
      text += c.value.text;
      c = await fleet.clock.runUntil(chunks.next());
    }
    await fleet.clock.runUntil(stream.result);
    return text;
  };
  return { fleet, prefills, stream, first: first.value, room, rest };
}

const want = generateInProcess(new DeterministicModel(), PROMPT, MAX_TOKENS).text;

/** What `pdctl usage` says the request's client was told: its prompt and every token it read. */
async function usage(fleet: Fleet) {
  const [u] = await usageOf(fleet.control.journal, { since: 0, until: fleet.clock.now() });
  return { requests: u?.requests, prompt: u?.promptTokens, completion: u?.completionTokens };
}
const told = {
  requests: 1,
  prompt: new DeterministicModel().tokenize(PROMPT).length,
  completion: MAX_TOKENS,
};

describe('a client that has only the first token, from the prefill engine', () => {
  it('reads the answer on unbroken when that prefill engine is killed before its transfer completed', async () => {
    const { fleet, prefills, first, room, rest } = await atFirstToken('stall');
    expect(first).toMatchObject({ index: 0, tokens: 1 });
    expect(room.state).not.toMatch(/transferred|decoding|completed/);
    const p = room.prefillEngine as string;
    for (const e of prefills) if (e.id !== p) e.transfer?.clearFaults();
    fleet.kill(p);
    expect(await rest()).toBe(want);
    // The request went on in a room whose context holds the first token: it was not drawn again.
    const next = [...fleet.disk.rooms.values()].find((r) => r.room !== room.room);
    expect(next?.prefillEngine).not.toBe(p);
    expect(await usage(fleet)).toEqual(told);
    await fleet.stop();
  });

  it('reads the answer on unbroken when its transfer arrives corrupt: the retry continues after the first token', async () => {
    const { fleet, prefills, first, room, rest } = await atFirstToken('corrupt');
    expect(first).toMatchObject({ index: 0, tokens: 1 });
    // The retry goes without this room's prefill engine; the other one's transfers are sound.
    for (const e of prefills) if (e.id !== room.prefillEngine) e.transfer?.clearFaults();
    expect(await rest()).toBe(want);
    expect(fleet.disk.rooms.get(room.room)).toMatchObject({
      state: 'failed',
      reason: 'kv_checksum_mismatch',
    });
    // What the client was told counts once: the first token in the failed room, the rest in
    // the room that continued after it.
    expect(await usage(fleet)).toEqual(told);
    await fleet.stop();
  });

  it('reads the answer on unbroken when the decode engine is killed right after it', async () => {
    const { fleet, first, room, rest } = await atFirstToken(null);
    expect(first).toMatchObject({ index: 0, tokens: 1 });
    fleet.kill(room.decodeEngine as string);
    expect(await rest()).toBe(want);
    expect(await usage(fleet)).toEqual(told);
    await fleet.stop();
  });
});
