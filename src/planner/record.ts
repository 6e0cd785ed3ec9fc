/**
 * What the planner reads: the committed record of one interval, summarised as distributions (not
 * means — a bimodal load has a p50 and a p99 that a mean would hide). `WindowRecord` folds the
 * journal's events in seq order, as the control plane commits them or as a replay reads them, and
 * `close` gives the summary of the events since the last close.
 *
 * Each room counts in the window its event fell in: an arrival at `room.created`, the prefill's
 * work at `room.transfer_posted`, its first token and inter-token latency at `room.completed`.
 * The health canary's rooms (origin `canary`) are not traffic, and are left out.
 */
import type { JournalEvent } from '../journal/events.ts';

export type Role = 'prefill' | 'decode';

/** Engines by role. */
export interface Fleet {
  prefill: number;
  decode: number;
}

export interface Distribution {
  count: number;
  p50: number | null;
  p90: number | null;
  p99: number | null;
}

export interface WindowSummary {
  /** Unix ms, the window's bounds [from, to). */
  from: number;
  to: number;
  /** Rooms created, per second of the window. */
  arrivalsPerS: number;
  promptTokens: Distribution;
  /** Tokens of the rooms that completed. */
  outputTokens: Distribution;
  /** Share of the prefix blocks that came from a prefill engine's cache (null: none reported). */
  prefixReuse: number | null;
  /**
   * Time to first token, estimated from the record: `room.created` to `room.decode_started`, plus
   * one inter-token interval (the first token is streamed, not journaled).
   */
  ttftMs: Distribution;
  /** Decode time over tokens after the first, per completed room. */
  itlMs: Distribution;
  /**
   * Engine-seconds of work per second of the window, by role: what the rooms that arrived bring
   * (arrivals a second × the work a room took, from the model's compute time each room reported,
   * `computeMicros`, or the time between its events where it reported none), or what was done in
   * the window if that is more. From arrivals, because what completes is capped by what the
   * engines can do: an overloaded role would look busy, never short. A load of 1.5 keeps one and a
   * half engines busy.
   */
  load: Fleet;
  /** Requests refused before any room existed (overload, no engines, …) and rooms that failed. */
  refused: number;
  failed: number;
  /** Engines registered and not gone at the window's end, by role. */
  engines: Fleet;
}

/** What a room's earlier events left for its later ones. */
interface Open {
  /** A canary's room: none of its events count. */
  canary: boolean;
  createdAt: number;
  prefillAt: number | null;
  decodeAt: number | null;
}

/** A room whose created event came before the record started is not counted in latencies. */
const MAX_OPEN = 1_000_000;

export class WindowRecord {
  private from: number;
  private readonly open = new Map<string, Open>();
  private readonly roles = new Map<string, Role>();
  private created = 0;
  private prompt: number[] = [];
  private output: number[] = [];
  private ttft: number[] = [];
  private itl: number[] = [];
  private work: Fleet = { prefill: 0, decode: 0 };
  /** Rooms whose work of each role was counted in the window. */
  private done: Fleet = { prefill: 0, decode: 0 };
  /** Microseconds of work a room takes, by role: the last window's that had rooms, kept across windows. */
  private readonly perRoom: Fleet = { prefill: 0, decode: 0 };
  private prefixBlocks = 0;
  private reusedBlocks = 0;
  private refused = 0;
  private failed = 0;

  constructor(from: number) {
    this.from = from;
  }

  fold(ev: JournalEvent): void {
    if (ev.room !== null && ev.type !== 'room.created' && this.open.get(ev.room)?.canary) {
      if (isEnd(ev.type)) this.open.delete(ev.room);
      return;
    }
    switch (ev.type) {
      case 'engine.registered':
        if (ev.engine !== null) this.roles.set(ev.engine, ev.data.role);
        return;
      case 'engine.exited':
        if (ev.engine !== null) this.roles.delete(ev.engine);
        return;
      case 'request.refused':
        this.refused += ev.data.count;
        return;
      case 'room.created': {
        const canary = ev.source === 'canary';
        if (ev.room !== null && (canary || this.open.size < MAX_OPEN))
          this.open.set(ev.room, { canary, createdAt: ev.ts, prefillAt: null, decodeAt: null });
        if (canary) return;
        this.created++;
        if (ev.data.promptTokens !== undefined) this.prompt.push(ev.data.promptTokens);
        if (ev.data.prefixBlocks !== undefined) this.prefixBlocks += ev.data.prefixBlocks;
        return;
      }
      case 'room.prefill_started': {
        const o = ev.room === null ? undefined : this.open.get(ev.room);
        if (o) o.prefillAt = ev.ts;
        return;
      }
      case 'room.transfer_posted': {
        const o = ev.room === null ? undefined : this.open.get(ev.room);
        const span = o?.prefillAt != null ? (ev.ts - o.prefillAt) * 1000 : 0;
        this.work.prefill += ev.data.computeMicros ?? span;
        this.done.prefill++;
        this.reusedBlocks += ev.data.reusedBlocks ?? 0;
        return;
      }
      case 'room.decode_started': {
        const o = ev.room === null ? undefined : this.open.get(ev.room);
        if (o) o.decodeAt = ev.ts;
        return;
      }
      case 'room.completed': {
        this.output.push(ev.data.tokens);
        const o = ev.room === null ? undefined : this.open.get(ev.room);
        if (ev.room !== null) this.open.delete(ev.room);
        const span = o?.decodeAt != null ? ev.ts - o.decodeAt : null;
        this.work.decode += ev.data.computeMicros ?? (span ?? 0) * 1000;
        this.done.decode++;
        if (o?.decodeAt == null || span === null) return;
        const itl = ev.data.tokens > 1 ? span / (ev.data.tokens - 1) : span;
        this.itl.push(itl);
        this.ttft.push(o.decodeAt - o.createdAt + (ev.data.tokens > 1 ? itl : span));
        return;
      }
      case 'room.failed':
        this.failed++;
        if (ev.room !== null) this.open.delete(ev.room);
        return;
      case 'room.aborted':
      case 'room.migrated':
        if (ev.room !== null) this.open.delete(ev.room);
        return;
      default:
        return;
    }
  }

  /** Engines of each role the record knows, now. */
  engines(): Fleet {
    const fleet: Fleet = { prefill: 0, decode: 0 };
    for (const role of this.roles.values()) fleet[role]++;
    return fleet;
  }

  /** Engine-seconds a second of `role`'s work: brought by the arrivals, or done, whichever is more. */
  private loadOf(role: Role, seconds: number): number {
    if (this.done[role] > 0) this.perRoom[role] = this.work[role] / this.done[role];
    const brought = this.created * this.perRoom[role];
    return Math.max(brought, this.work[role]) / 1e6 / seconds;
  }

  /** The summary of what was folded since the last close, over [from, to); starts the next window. */
  close(to: number): WindowSummary {
    const seconds = Math.max(to - this.from, 1000) / 1000;
    const summary: WindowSummary = {
      from: this.from,
      to,
      arrivalsPerS: this.created / seconds,
      promptTokens: distribution(this.prompt),
      outputTokens: distribution(this.output),
      prefixReuse: this.prefixBlocks > 0 ? this.reusedBlocks / this.prefixBlocks : null,
      ttftMs: distribution(this.ttft),
      itlMs: distribution(this.itl),
      load: {
        prefill: this.loadOf('prefill', seconds),
        decode: this.loadOf('decode', seconds),
      },
      refused: this.refused,
      failed: this.failed,
      engines: this.engines(),
    };
    this.from = to;
    this.created = 0;
    this.prompt = [];
    this.output = [];
    this.ttft = [];
    this.itl = [];
    this.work = { prefill: 0, decode: 0 };
    this.done = { prefill: 0, decode: 0 };
    this.prefixBlocks = 0;
    this.reusedBlocks = 0;
    this.refused = 0;
    this.failed = 0;
    return summary;
  }
}

const isEnd = (type: string) =>
  type === 'room.completed' ||
  type === 'room.failed' ||
  type === 'room.aborted' ||
  type === 'room.migrated';

/** Nearest-rank percentiles of the values (sorted here). */
export function distribution(values: number[]): Distribution {
  const sorted = [...values].sort((a, b) => a - b);
  const at = (p: number) =>
    sorted.length === 0
      ? null
      : (sorted[Math.min(sorted.length - 1, Math.ceil(p * sorted.length) - 1)] as number);
  return { count: sorted.length, p50: at(0.5), p90: at(0.9), p99: at(0.99) };
}
