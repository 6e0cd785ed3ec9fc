/**
 * The random port (issue 41): where a module draws chance (jitter, sampling, a workload's
 * arrivals), behind one interface with two adapters. `systemRandom` is Math.random; `seeded(s)`
 * is a small, fast generator (sfc32, seeded through splitmix32) whose every draw follows from the
 * seed, so a simulated run repeats exactly. `fork(label)` gives a part of a run its own stream:
 * adding draws in one part then leaves every other part's draws as they were.
 */

export interface Random {
  /** A float in [0, 1). */
  next(): number;
  /** An integer in [0, n). */
  int(n: number): number;
  /** An integer in [lo, hi]. */
  between(lo: number, hi: number): number;
  /** True with probability p. */
  chance(p: number): boolean;
  /** One element of a non-empty list. */
  pick<T>(items: readonly T[]): T;
  /** A generator of its own, named: the same seed and label always give the same stream. */
  fork(label: string): Random;
}

abstract class Draws implements Random {
  abstract next(): number;
  abstract fork(label: string): Random;

  int(n: number): number {
    if (!Number.isInteger(n) || n < 1) throw new RangeError(`int takes a whole n ≥ 1, got ${n}`);
    return Math.floor(this.next() * n);
  }

  between(lo: number, hi: number): number {
    if (!Number.isInteger(lo) || !Number.isInteger(hi) || hi < lo)
      throw new RangeError(`between takes whole lo ≤ hi, got ${lo}, ${hi}`);
    return lo + this.int(hi - lo + 1);
  }

  chance(p: number): boolean {
    return this.next() < p;
  }

  pick<T>(items: readonly T[]): T {
    if (items.length === 0) throw new RangeError('pick needs at least one item');
    return items[this.int(items.length)] as T;
  }
}

class SystemRandom extends Draws {
  next(): number {
    return Math.random();
  }
  fork(): Random {
    return this;
  }
}

/** The process's randomness: Math.random (forks are the same source). */
export const systemRandom: Random = new SystemRandom();

/** splitmix32: spreads a 32-bit seed over the generator's state. */
function splitmix32(state: number): [number, number] {
  const s = (state + 0x9e3779b9) | 0;
  let z = s;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return [s, (z ^ (z >>> 16)) >>> 0];
}

/** FNV-1a of a string: a fork's label as a number to mix into its seed. */
function hash(label: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < label.length; i++) h = Math.imul(h ^ label.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

class Sfc32 extends Draws {
  private a: number;
  private b: number;
  private c: number;
  private d = 1;

  constructor(private readonly seed: number) {
    super();
    let s = seed | 0;
    let x: number;
    [s, x] = splitmix32(s);
    this.a = x;
    [s, x] = splitmix32(s);
    this.b = x;
    [, x] = splitmix32(s);
    this.c = x;
    // The first draws of sfc32 still show the seed: skip them.
    for (let i = 0; i < 12; i++) this.step();
  }

  private step(): number {
    const t = (((this.a + this.b) | 0) + this.d) | 0;
    this.d = (this.d + 1) | 0;
    this.a = this.b ^ (this.b >>> 9);
    this.b = (this.c + (this.c << 3)) | 0;
    this.c = (this.c << 21) | (this.c >>> 11);
    this.c = (this.c + t) | 0;
    return t >>> 0;
  }

  next(): number {
    return this.step() / 4294967296;
  }

  fork(label: string): Random {
    return new Sfc32((this.seed ^ hash(label)) >>> 0);
  }
}

/** A generator whose every draw follows from `seed` (an integer; only its low 32 bits count). */
export function seeded(seed: number): Random {
  if (!Number.isInteger(seed)) throw new RangeError(`a seed is an integer, got ${seed}`);
  return new Sfc32(seed >>> 0);
}
