/**
 * The id port (issue 41): where event ids, room ids and incarnations come from. Ids are made of
 * time and chance, so they come from a `Clock` and a source of random bytes: `systemIds` from the
 * process's clock and the OS's randomness, `seededIds` from a simulator's virtual clock and seed,
 * so that a simulated run names everything the same way every time.
 *
 * Event ids and room ids are keys of B-tree indexes that every append writes; ids that grow with
 * time land on the right edge of the tree, while random UUIDs touch a random page per insert,
 * which costs more as the index outgrows the cache (bench/journal.ts prints the bare-loop figure
 * for both).
 */
import { randomFillSync } from 'node:crypto';
import { type Clock, systemClock } from './clock.ts';
import type { Random } from './random.ts';

export interface Ids {
  /** A UUIDv7 (RFC 9562): event ids and incarnations. */
  uuid(): string;
  /** A short, sortable room id such as `r-mf3k2a9x-0001c4`. */
  room(): string;
}

/** Time-ordered ids on `clock`, their random bits from `fill`. */
export class IdSource implements Ids {
  /** Random bytes drawn in bulk: one call of `fill` per 512 ids instead of one per id. */
  private readonly pool = Buffer.alloc(4096);
  private poolOffset = this.pool.length;
  private lastMs = 0;
  private counter = 0;
  private roomCounter = 0;

  constructor(
    private readonly clock: Clock,
    private readonly fill: (into: Buffer) => void,
  ) {}

  uuid(now: number = this.clock.now()): string {
    if (now > this.lastMs) {
      this.lastMs = now;
      this.counter = 0;
    } else {
      this.counter++;
      if (this.counter > 0xfff) {
        this.lastMs++;
        this.counter = 0;
      }
    }
    const ms = this.lastMs.toString(16).padStart(12, '0');
    const pool = this.pool;
    if (this.poolOffset + 8 > pool.length) {
      this.fill(pool);
      this.poolOffset = 0;
    }
    const at = this.poolOffset;
    pool[at] = ((pool[at] as number) & 0x3f) | 0x80;
    const tail = pool.toString('hex', at, at + 8);
    this.poolOffset += 8;
    return `${ms.slice(0, 8)}-${ms.slice(8, 12)}-7${this.counter.toString(16).padStart(3, '0')}-${tail.slice(0, 4)}-${tail.slice(4, 16)}`;
  }

  room(now: number = this.clock.now()): string {
    this.roomCounter = (this.roomCounter + 1) % 0x1000000;
    return `r-${now.toString(36)}-${this.roomCounter.toString(16).padStart(6, '0')}`;
  }
}

/** The process's ids: its clock, the OS's random bytes. */
export const systemIds = new IdSource(systemClock, (into) => randomFillSync(into));

/** Ids that follow from a simulator's clock and seed. */
export function seededIds(clock: Clock, random: Random): Ids {
  return new IdSource(clock, (into) => {
    for (let i = 0; i < into.length; i++) into[i] = random.int(256);
  });
}
