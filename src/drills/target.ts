/**
 * What a drill sees of the stack it runs against, and what it may do to it. Two stand behind it:
 * a stack this process started (`LocalTarget`), and a running `pdctl serve` named by `--url`
 * (`RemoteTarget`, remote-target.ts), seen only through its HTTP API, as an operator sees it.
 * Scenarios are written against this interface, so the same drill proves the same invariants
 * either way.
 */

import type { Stack } from '../app/stack.ts';
import type { CommandName } from '../bus/protocol.ts';
import type { ControlPlane } from '../control/control-plane.ts';
import type { Canary } from '../control/evidence/canary.ts';
import type { Timeline, VerifyReport } from '../journal/store.ts';
import type { EventData, EventInput, EventType, JournalEventOf } from '../room/events.ts';
import { isTerminal, type RoomState } from '../room/states.ts';

export interface EngineView {
  id: string;
  role: 'prefill' | 'decode';
  pid: number;
  incarnation: string;
  /** Registered and replayed: it gets events. */
  live: boolean;
  /** Age of its last heartbeat when asked, ms; null before the first on this connection. */
  heartbeatAgeMs: number | null;
  freePages: number | null;
  totalPages: number;
  /** It accepts `inject_fault` (started with `--allow-fault-injection`). */
  faultInjection: boolean;
  /** Why it takes no rooms now, and what takes it back; null: in rotation. */
  outOfRotation: OutOfRotation | null;
}

/** An engine out of rotation: what it is (cordoned, ejected, draining), and the command that undoes it. */
export interface OutOfRotation {
  what: string;
  /** A pdctl command line without `--url`; null where nothing is to be run (it ends by itself). */
  undo: string | null;
}

/** From what `/v1/engines` (and the control plane's view) says of an engine. */
export function outOfRotation(
  id: string,
  e: {
    status: string;
    cordon: { by: string; reason: string } | null;
    ejection: { reason: string } | null;
  },
): OutOfRotation | null {
  if (e.cordon)
    return {
      what: `cordoned by the ${e.cordon.by}: ${e.cordon.reason}`,
      undo: `pdctl engines uncordon ${id}`,
    };
  if (e.ejection) return { what: `ejected as an outlier: ${e.ejection.reason}`, undo: null };
  if (e.status === 'draining') return { what: 'draining', undo: `pdctl engines undrain ${id}` };
  return null;
}

export interface LiveRoom {
  room: string;
  state: RoomState;
  prefillEngine: string;
  decodeEngine: string;
}

export interface BusView {
  /** Where engines connect, with a wildcard host replaced by one this process can reach. */
  endpoint: string;
  /** Frames dropped as malformed, all reasons together. */
  dropped: number;
  loopRestarts: number;
}

export interface CanaryOutcome {
  ok: boolean;
  ms: number;
  stage: string | null;
  reason: string | null;
}

export type DrillEventType = 'drill.started' | 'drill.finished';

/** A room changed state: `from` is null for a room the drill had not seen before. */
export type RoomWatcher = (room: string, from: RoomState | null, to: RoomState) => void;

export interface DrillTarget {
  /** `local`: started by this drill; `remote`: a `pdctl serve` at `--url`. */
  readonly kind: 'local' | 'remote';
  /** The serving API, e.g. `http://127.0.0.1:8080`. */
  readonly base: string;
  readonly model: string;
  /** False when the stack runs on another host: no signals, no journal file. */
  readonly sameHost: boolean;
  engines(): Promise<EngineView[]>;
  /** Rooms not yet terminal. */
  liveRooms(): Promise<LiveRoom[]>;
  /** Journal events of `type` at or after `since` (unix ms), oldest first. */
  events<T extends EventType>(
    type: T,
    since: number,
    engine?: string,
  ): Promise<JournalEventOf<T>[]>;
  timeline(room: string): Promise<Timeline>;
  /** Every room alive at some point since `since` (unix ms). */
  roomsSince(since: number): Promise<string[]>;
  /** A recovery command or a drill fault to an engine; false when it is not connected. */
  command(engine: string, command: CommandName, arg?: string): Promise<boolean>;
  /**
   * Clears every fault this drill injected (`inject_fault none` to each engine it hit), so that a
   * drill that ends early — an error, Ctrl-C — does not leave a running stack corrupting KV.
   * The engines it could not reach, if any.
   */
  clearFaults(): Promise<string[]>;
  /** Signals an engine's process and says which pid; throws when it cannot (another host). */
  signal(engine: string, sig: NodeJS.Signals): Promise<number>;
  /** `/health/ready`'s verdict now. */
  ready(): Promise<boolean>;
  /** One canary room now, as `/health/deep` runs it. */
  canary(deadlineMs: number): Promise<CanaryOutcome>;
  /** Whether the room is one of the stack's own canaries (only a local target can tell). */
  isCanaryRoom(room: string): boolean;
  bus(): Promise<BusView>;
  /** `journal verify` on the stack's journal, or why it cannot be run from here. */
  verify(): Promise<VerifyReport | string>;
  /** Calls `watcher` on every room transition until the returned function is called. */
  watchRooms(watcher: RoomWatcher): () => void;
  /** Journals the drill's start and end, where the target lets a drill write (local only). */
  record<T extends DrillEventType>(type: T, data: EventData<T>): Promise<void>;
  close(): Promise<void>;
}

/** The engines a drill injected a fault into and has not cleared: what `clearFaults` undoes. */
export class InjectedFaults {
  private readonly engines = new Set<string>();

  /** Notes a command about to be sent: a fault adds its engine, `none` takes it off. */
  note(engine: string, command: CommandName, arg: string | undefined): void {
    if (command !== 'inject_fault') return;
    if (arg === 'none') this.engines.delete(engine);
    else this.engines.add(engine);
  }

  /** Sends `inject_fault none` to each through `target`; the engines it could not reach. */
  async clear(target: Pick<DrillTarget, 'command'>): Promise<string[]> {
    const missed: string[] = [];
    for (const engine of [...this.engines]) {
      const sent = await target.command(engine, 'inject_fault', 'none').catch(() => false);
      if (!sent) missed.push(engine);
    }
    return missed;
  }
}

/** A stack this process started: everything is at hand, including its processes and journal. */
export class LocalTarget implements DrillTarget {
  readonly kind = 'local';
  readonly sameHost = true;
  readonly control: ControlPlane;
  /** The stack's journal, with the fault hooks a drill uses (a full disk). */
  readonly journal: Stack['journal'];

  constructor(
    readonly stack: Stack,
    readonly base: string,
    private readonly canaryRunner: Canary,
    private readonly readiness: () => boolean,
  ) {
    this.control = stack.control;
    this.journal = stack.journal;
  }

  get model(): string {
    return this.control.modelInfo.name;
  }

  async engines(): Promise<EngineView[]> {
    const now = Date.now();
    return this.control.engines().map((s) => ({
      id: s.engine,
      role: s.role,
      pid: s.pid,
      incarnation: s.incarnation,
      live: s.status !== 'connecting',
      heartbeatAgeMs: s.beats > 0 ? now - s.lastSeen : null,
      freePages: s.heartbeat?.freePages ?? null,
      totalPages: s.pages,
      faultInjection: s.faultInjection,
      outOfRotation: outOfRotation(s.engine, s),
    }));
  }

  async liveRooms(): Promise<LiveRoom[]> {
    return [...this.control.liveRooms()]
      .filter((r) => !isTerminal(r.state))
      .map(({ room, state, prefillEngine, decodeEngine }) => ({
        room,
        state,
        prefillEngine,
        decodeEngine,
      }));
  }

  events<T extends EventType>(
    type: T,
    since: number,
    engine?: string,
  ): Promise<JournalEventOf<T>[]> {
    return this.journal.tail({ type, engine, since, limit: 10_000, order: 'oldest' });
  }

  timeline(room: string): Promise<Timeline> {
    return this.journal.timeline(room);
  }

  async roomsSince(since: number): Promise<string[]> {
    const ids: string[] = [];
    let cursor: string | undefined;
    do {
      const page = await this.journal.rooms({ since, limit: 10_000, cursor });
      for (const r of page.rooms) ids.push(r.room);
      cursor = page.nextCursor ?? undefined;
    } while (cursor);
    return ids;
  }

  private readonly faults = new InjectedFaults();

  async command(engine: string, command: CommandName, arg?: string): Promise<boolean> {
    this.faults.note(engine, command, arg);
    return this.control.command(engine, command, null, arg ?? 'drill');
  }

  clearFaults(): Promise<string[]> {
    return this.faults.clear(this);
  }

  async signal(engine: string, sig: NodeJS.Signals): Promise<number> {
    const pid = this.stack.engines.pid(engine);
    if (pid === undefined || !this.stack.engines.signal(engine, sig))
      throw new Error(`engine ${engine} has no running process to signal`);
    return pid;
  }

  async ready(): Promise<boolean> {
    return this.readiness();
  }

  async canary(deadlineMs: number): Promise<CanaryOutcome> {
    const r = await this.canaryRunner.run(deadlineMs);
    return { ok: r.ok, ms: r.ms, stage: r.stage, reason: r.reason };
  }

  isCanaryRoom(room: string): boolean {
    return this.canaryRunner.recentRooms.has(room);
  }

  async bus(): Promise<BusView> {
    const { bus } = this.control;
    const dropped = Object.values(bus.drops.snapshot()).reduce((a, b) => a + b, 0);
    return { endpoint: this.control.endpoint, dropped, loopRestarts: bus.loop.restarts };
  }

  verify(): Promise<VerifyReport> {
    return this.journal.verify();
  }

  watchRooms(watcher: RoomWatcher): () => void {
    return this.control.onRoomEvent((before, after) => {
      if (before?.state !== after.state) watcher(after.room, before?.state ?? null, after.state);
    });
  }

  async record<T extends DrillEventType>(type: T, data: EventData<T>): Promise<void> {
    await this.journal.append({ type, source: 'drill', data } as EventInput);
  }

  async close(): Promise<void> {}
}
