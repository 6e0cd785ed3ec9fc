/**
 * Who leads an in-memory journal (issue 41): what the `leadership` row and `leader_terms` table
 * of a PostgreSQL journal hold (postgres/leadership.ts), kept on the `MemoryDisk` beside the
 * events, so the simulator can run a control plane and its standby on one journal. The leader
 * renews a lease on the journal's clock; a contender takes term + 1 when the leader closed
 * (`resigned`), crashed (`holder_gone`: a dead process's session ends with it) or stopped renewing
 * (`lease_expired`: it is frozen), and every commit of the old term is refused from then on,
 * however late its writer wakes up.
 */
import type { LeaderTerm } from '../store.ts';

export type TakeoverHow = 'vacant' | 'resigned' | 'holder_gone' | 'lease_expired';

/** The leadership row. */
export interface MemoryLeader {
  term: number;
  holder: string | null;
  /** Unix ms on the journal's clock; 0 once its holder resigned. */
  leaseUntil: number;
  acquiredAt: number;
}

export type LeadAttempt =
  | { ok: true; term: number; how: TakeoverHow; previous: string | null }
  | { ok: false; current: Readonly<MemoryLeader> };

export class MemoryLeadership {
  readonly row: MemoryLeader = { term: 0, holder: null, leaseUntil: 0, acquiredAt: 0 };
  /** Every term, oldest first, with the events written under it (`stats().leaders`). */
  readonly terms: LeaderTerm[] = [];

  /**
   * One attempt to lead, at `now`: granted when nobody leads, the leader resigned or crashed
   * (`writing` false: no live writer holds the disk), or its lease ran out.
   */
  tryLead(holder: string, leaseMs: number, now: number, writing: boolean): LeadAttempt {
    const { row } = this;
    let how: TakeoverHow;
    if (row.holder === null) how = 'vacant';
    else if (row.leaseUntil === 0) how = 'resigned';
    else if (!writing) how = 'holder_gone';
    else if (row.leaseUntil < now) how = 'lease_expired';
    else return { ok: false, current: { ...row } };
    const previous = row.holder;
    row.term++;
    row.holder = holder;
    row.leaseUntil = now + leaseMs;
    row.acquiredAt = now;
    this.terms.push({ term: row.term, holder, acquiredAt: now, how, previous, events: 0 });
    return { ok: true, term: row.term, how, previous };
  }

  /** Extends the lease; false when `term` is no longer the current one (its holder was deposed). */
  renew(term: number, leaseMs: number, now: number): boolean {
    if (this.row.term !== term) return false;
    this.row.leaseUntil = now + leaseMs;
    return true;
  }

  /** A leader closing cleanly hands over at once. */
  resign(term: number): void {
    if (this.row.term === term) this.row.leaseUntil = 0;
  }

  /** `events` committed under `term` (which the caller checked is current). */
  wrote(term: number, events: number): void {
    const t = this.terms.at(-1);
    if (t?.term === term) t.events += events;
  }
}
