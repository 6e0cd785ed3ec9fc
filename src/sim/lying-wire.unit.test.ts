import { Packr } from 'msgpackr';
import { describe, expect, it } from 'vitest';
import { BATCH_KIND, encodeBatch, encodePayload } from '../bus/protocol.ts';
import { sayFrames } from './lying-wire.ts';

const packr = new Packr({ useRecords: false, mapsAsObjects: true, moreTypes: false });
const tokens = { room: 'r-own', index: 0, text: ' a', tokens: 1 };
const beat = { state: 'ready' };
const toOther = (m: typeof tokens) => ({ ...m, room: 'r-other' });

describe('a lying engine’s frames', () => {
  it('names another room in a tokens message, alone or in a batch, and leaves the rest as sent', () => {
    const [kind, alone] = sayFrames(['tokens', encodePayload(tokens)], toOther);
    expect(kind).toBe('tokens');
    expect(packr.unpack(alone as Buffer)).toEqual({ ...tokens, room: 'r-other' });
    const hb = encodePayload(beat);
    const batch = encodeBatch([
      ['heartbeat', hb],
      ['tokens', encodePayload(tokens)],
    ]);
    const [bkind, packed] = sayFrames([BATCH_KIND, batch], toOther);
    expect(bkind).toBe(BATCH_KIND);
    const { items } = packr.unpack(packed as Buffer) as { items: Array<[string, Buffer]> };
    expect(items.map(([k]) => k)).toEqual(['heartbeat', 'tokens']);
    expect(Buffer.compare(items[0]?.[1] as Buffer, hb)).toBe(0);
    expect(packr.unpack(items[1]?.[1] as Buffer)).toMatchObject({ room: 'r-other' });
    // Telling the truth: the very frames sent.
    const heartbeat: Array<Buffer | string> = ['heartbeat', hb];
    expect(sayFrames(heartbeat, (m) => m)).toEqual(heartbeat);
  });
});
