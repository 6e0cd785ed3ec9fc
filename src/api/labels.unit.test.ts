import { describe, expect, it } from 'vitest';
import { BoundedLabel } from './labels.ts';

describe('BoundedLabel', () => {
  it('keeps codes, turns free text into other, and stops growing at its cap', () => {
    const l = new BoundedLabel(['length'], 3);
    expect(l.of('length')).toBe('length');
    expect(l.of('deadline_exceeded')).toBe('deadline_exceeded');
    expect(l.of('decode-0 lost: process 17272 exited (SIGKILL)')).toBe('other');
    expect(l.of('Transfer_Stalled')).toBe('other');
    expect(l.of(null)).toBe('none');
    expect(l.of('engine_lost')).toBe('engine_lost');
    // Full: a fourth code is other, while those seen keep their own label.
    expect(l.of('kv_pool_exhausted')).toBe('other');
    expect(l.of('deadline_exceeded')).toBe('deadline_exceeded');
  });
});
