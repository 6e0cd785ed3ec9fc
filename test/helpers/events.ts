/** Event builders shared by the journal tests. */
import type { EventInput } from '../../src/journal/events.ts';

export function lifecycle(room: string, p = 'p0', d = 'd0'): EventInput[] {
  return [
    {
      type: 'room.created',
      room,
      source: 'test',
      data: { prefillEngine: p, decodeEngine: d, promptTokens: 12, maxTokens: 8 },
    },
    { type: 'room.bootstrap_started', room, engine: d, source: d, data: {} },
    { type: 'room.bootstrapped', room, engine: d, source: d, data: { pages: [0, 1] } },
    { type: 'room.prefill_started', room, engine: p, source: p, data: {} },
    { type: 'room.transfer_posted', room, engine: p, source: p, data: { pairs: 2 } },
    {
      type: 'room.transfer_completed',
      room,
      engine: p,
      source: p,
      data: { bytes: 4096, checksum: 'c0ffee', micros: 31 },
    },
    { type: 'room.released', room, engine: p, source: p, data: { pages: 2 } },
    { type: 'room.decode_started', room, engine: d, source: d, data: {} },
    {
      type: 'room.completed',
      room,
      engine: d,
      source: d,
      data: { tokens: 8, finishReason: 'length' },
    },
    { type: 'room.released', room, engine: d, source: d, data: { pages: 2 } },
  ];
}

export function created(room: string, ts?: number): EventInput {
  return {
    type: 'room.created',
    room,
    source: 'test',
    ...(ts !== undefined ? { ts } : {}),
    data: { prefillEngine: 'p0', decodeEngine: 'd0' },
  };
}
