import { describe, expect, it } from 'vitest';
import { eventIdOf, eventKey } from './event-keys.ts';

const UUID = '01a23fd8-2e22-7000-9901-83b1267ddc83';

describe('event keys', () => {
  it.each([
    ['a UUID', UUID, 'api', 17, 0],
    ['an engine id in its namespace', `engine:decode-0/${UUID}`, 'engine:decode-0', 17, 1],
    ['a deterministic id', 'r-mx8mt0ki-000002:aborted', 'watchdog', 26, 2],
    ['an id in another namespace than its source', `engine:decode-0/${UUID}`, 'api', 53, 2],
    ['an upper-case UUID (kept as it is)', UUID.toUpperCase(), 'api', 37, 2],
    ['sixteen characters of text', 'abcdefghijklmnop', 'api', 17, 2],
    ['text beyond ASCII', 'réessai-1', 'api', 11, 2],
  ])('stores %s in its short form and reads it back exactly', (_, id, source, bytes, tag) => {
    const key = eventKey(id, source);
    expect(key.length).toBe(bytes);
    expect(key[0]).toBe(tag);
    expect(eventIdOf(key, source)).toBe(id);
  });

  it('gives one key to one id, and different keys to different ids', () => {
    expect(eventKey(UUID, 'api').equals(eventKey(UUID, 'api'))).toBe(true);
    expect(eventKey(UUID, 'api').equals(eventKey(`engine:p0/${UUID}`, 'engine:p0'))).toBe(false);
    expect(eventKey('abcdefghijklmnop', 'api').equals(eventKey(UUID, 'api'))).toBe(false);
  });

  it('refuses a key pdctl does not write, naming it', () => {
    expect(() => eventIdOf(Buffer.from('07aa', 'hex'), 'api')).toThrow(
      /07aa is not one pdctl writes/,
    );
    expect(() => eventIdOf(Buffer.from('00aa', 'hex'), 'api')).toThrow(/00aa/);
  });
});
