import { describe, expect, it } from 'vitest';
import { ENGINE_DEFAULTS, resolveEngineOptions } from './options.ts';

const base = { id: 'decode-0', role: 'decode', control: 'tcp://127.0.0.1:5557' };

describe('engine options', () => {
  it('fills defaults and freezes', () => {
    const o = resolveEngineOptions(base);
    expect(o.pages).toBe(ENGINE_DEFAULTS.pages);
    expect(o.poolName).toMatch(/^\/pdctl-decode-0-\d+$/);
    expect(Object.isFrozen(o)).toBe(true);
  });

  it('names the closest valid key for a misspelled one', () => {
    expect(() => resolveEngineOptions({ ...base, pagebytes: 4096 })).toThrow(
      /did you mean "pageBytes"/,
    );
  });

  it('says what is wrong with a bad value', () => {
    expect(() => resolveEngineOptions({ ...base, role: 'both' })).toThrow(
      /role must be prefill or decode/,
    );
    expect(() => resolveEngineOptions({ ...base, control: 'localhost:5557' })).toThrow(
      /tcp:\/\/ or ipc:\/\//,
    );
    expect(() => resolveEngineOptions({ ...base, pageBytes: 100 })).toThrow(/multiple of 64/);
    expect(() => resolveEngineOptions({ ...base, kvBytesPerToken: 48 })).toThrow(
      /divides pageBytes/,
    );
    expect(() => resolveEngineOptions({ ...base, pages: 0 })).toThrow(
      /pages must be an integer from 1/,
    );
    expect(() => resolveEngineOptions({ ...base, kvDevice: -1 })).toThrow(
      /kvDevice must be an integer from 0 to 1023/,
    );
  });

  it('keeps KV pages in host shared memory unless given a CUDA device', () => {
    expect(resolveEngineOptions(base).kvDevice).toBeNull();
    expect(resolveEngineOptions({ ...base, kvDevice: 1 }).kvDevice).toBe(1);
  });
});
