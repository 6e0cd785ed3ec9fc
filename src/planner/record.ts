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
import type { JournalEvent } from '../room/events.ts';

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
   * Engine-seconds of work per second of the window, by role: what the rooms that arrived bring,
   * or what was done in the window if that is more. What an arrival brings is priced per token,
   * at rates learned from the rooms that finished (the model's compute time each reported,
   * `computeMicros`, or the time between its events where it reported none): prefill, its prompt
   * tokens × the work a prompt token took; decode, its `maxTokens` × the share of `maxTokens`
   * finished rooms used × the work an output token took (a room without those counts as the work
   * a room took). From arrivals, because what completes is capped by what the engines can do: an
   * overloaded role would look busy, never short; and per token, because rooms that finish lag
   * behind a change of shape (longer answers are known as soon as they are asked for, not when
   * the first of them is done). A load of 1.5 keeps one and a half engines busy.
   */
  load: Fleet;
  /**
   * Requests waiting in flow control's queue at the window's end: demand that has no room yet,
   * priced into `load` as arrivals are (it counts again in the window it gets its room).
   */
  queued: number;
  /** Requests refused before any room existed (overload, no engines, …) and rooms that failed. */
  refused: number;
  failed: number;
  /** Engines registered and not gone at the window's end, by role. */
  engines: Fleet;
}

/** A request waiting in flow control's queue: what it will ask of the engines. */
export interface QueuedRequest {
  promptTokens: number;
  maxTokens: number;
}

/** What a room's earlier events left for its later ones. */
interface Open {
  /** A canary's room: none of its events count. */
  canary: boolean;
  createdAt: number;
  promptTokens: number | null;
  maxTokens: number | null;
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
  /** What the window's arrivals asked for, priced in close (see `WindowSummary.load`). */
  private asked = new Asked();
  /** What the window's finished rooms say a token costs. */
  private priced = new Priced();
  /** The rates arrivals are priced at: the last window's that had rooms, kept across windows. */
  private readonly rates = new Rates();
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
        const promptTokens = ev.data.promptTokens ?? null;
        const maxTokens = ev.data.maxTokens ?? null;
        if (ev.room !== null && (canary || this.open.size < MAX_OPEN))
          this.open.set(ev.room, {
            canary,
            createdAt: ev.ts,
            promptTokens,
            maxTokens,
            prefillAt: null,
            decodeAt: null,
          });
        if (canary) return;
        this.created++;
        this.asked.arrived(promptTokens, maxTokens);
        if (promptTokens !== null) this.prompt.push(promptTokens);
        if (ev.data.prefixBlocks !== undefined) this.prefixBlocks += ev.data.prefixBlocks;
        return;
      }
      case 'room.prefill_started': {
        const o = this.openOf(ev.room);
        if (o) o.prefillAt = ev.ts;
        return;
      }
      case 'room.transfer_posted': {
        const o = this.openOf(ev.room);
        const span = o?.prefillAt != null ? (ev.ts - o.prefillAt) * 1000 : 0;
        const micros = ev.data.computeMicros ?? span;
        this.work.prefill += micros;
        this.done.prefill++;
        if (o?.promptTokens) this.priced.prefill(micros, o.promptTokens);
        this.reusedBlocks += ev.data.reusedBlocks ?? 0;
        return;
      }
      case 'room.decode_started': {
        const o = this.openOf(ev.room);
        if (o) o.decodeAt = ev.ts;
        return;
      }
      case 'room.completed': {
        this.output.push(ev.data.tokens);
        const o = this.openOf(ev.room);
        if (ev.room !== null) this.open.delete(ev.room);
        const span = o?.decodeAt != null ? ev.ts - o.decodeAt : null;
        const micros = ev.data.computeMicros ?? (span ?? 0) * 1000;
        this.work.decode += micros;
        this.done.decode++;
        this.priced.decode(micros, ev.data.tokens, o?.maxTokens ?? null);
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

  private openOf(room: string | null): Open | undefined {
    return room === null ? undefined : this.open.get(room);
  }

  /** Engines of each role the record knows, now. */
  engines(): Fleet {
    const fleet: Fleet = { prefill: 0, decode: 0 };
    for (const role of this.roles.values()) fleet[role]++;
    return fleet;
  }

  private load(seconds: number, arrived: number): Fleet {
    this.priced.into(this.rates);
    return {
      prefill: this.loadOf('prefill', seconds, arrived),
      decode: this.loadOf('decode', seconds, arrived),
    };
  }

  /** Engine-seconds a second of `role`'s work: brought by the arrivals, or done, whichever is more. */
  private loadOf(role: Role, seconds: number, arrived: number): number {
    if (this.done[role] > 0) this.rates.perRoom[role] = this.work[role] / this.done[role];
    const brought = this.asked.brought(role, arrived, this.rates);
    return Math.max(brought, this.work[role]) / 1e6 / seconds;
  }

  /**
   * The summary of what was folded since the last close, over [from, to); starts the next window.
   * `queued`: the requests waiting in flow control's queue now, as the planner reads it.
   */
  close(to: number, queued: readonly QueuedRequest[] = []): WindowSummary {
    const seconds = Math.max(to - this.from, 1000) / 1000;
    for (const q of queued) this.asked.arrived(q.promptTokens, q.maxTokens);
    const summary: WindowSummary = {
      from: this.from,
      to,
      arrivalsPerS: this.created / seconds,
      promptTokens: distribution(this.prompt),
      outputTokens: distribution(this.output),
      prefixReuse: this.prefixBlocks > 0 ? this.reusedBlocks / this.prefixBlocks : null,
      ttftMs: distribution(this.ttft),
      itlMs: distribution(this.itl),
      load: this.load(seconds, this.created + queued.length),
      queued: queued.length,
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
    this.asked = new Asked();
    this.priced = new Priced();
    this.prefixBlocks = 0;
    this.reusedBlocks = 0;
    this.refused = 0;
    this.failed = 0;
    return summary;
  }
}

/** Microseconds a prompt token, an output token and a room take, and the share of `maxTokens` used. */
class Rates {
  prefillPerToken = 0;
  decodePerToken = 0;
  /** Output tokens over `maxTokens`, of the rooms that said both. */
  usedShare = 1;
  readonly perRoom: Fleet = { prefill: 0, decode: 0 };
}

/** Sums over a window's finished rooms, for the rates. */
class Priced {
  private prefillMicros = 0;
  private promptTokens = 0;
  private decodeMicros = 0;
  private outputTokens = 0;
  private used = 0;
  private asked = 0;

  prefill(micros: number, promptTokens: number): void {
    this.prefillMicros += micros;
    this.promptTokens += promptTokens;
  }

  decode(micros: number, tokens: number, maxTokens: number | null): void {
    if (tokens <= 0) return;
    this.decodeMicros += micros;
    this.outputTokens += tokens;
    if (maxTokens) {
      this.used += Math.min(tokens, maxTokens);
      this.asked += maxTokens;
    }
  }

  /** The window's rates, where it had rooms to learn them from. */
  into(rates: Rates): void {
    if (this.promptTokens > 0) rates.prefillPerToken = this.prefillMicros / this.promptTokens;
    if (this.outputTokens > 0) rates.decodePerToken = this.decodeMicros / this.outputTokens;
    if (this.asked > 0) rates.usedShare = this.used / this.asked;
  }
}

/** Sums over a window's arrivals: what they asked for. */
class Asked {
  private promptTokens = 0;
  private withPrompt = 0;
  private maxTokens = 0;
  private withMax = 0;

  arrived(promptTokens: number | null, maxTokens: number | null): void {
    if (promptTokens !== null) {
      this.promptTokens += promptTokens;
      this.withPrompt++;
    }
    if (maxTokens !== null) {
      this.maxTokens += maxTokens;
      this.withMax++;
    }
  }

  /** Microseconds of `role`'s work the window's `created` arrivals bring, at `rates`. */
  brought(role: Role, created: number, rates: Rates): number {
    const [counted, tokens, perToken] =
      role === 'prefill'
        ? [this.withPrompt, this.promptTokens, rates.prefillPerToken]
        : [this.withMax, this.maxTokens * rates.usedShare, rates.decodePerToken];
    // Before any rate is learned, or for arrivals that did not say, a room's work as a room.
    if (perToken === 0) return created * rates.perRoom[role];
    return tokens * perToken + (created - counted) * rates.perRoom[role];
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
