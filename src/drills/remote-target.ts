/**
 * A running `pdctl serve` as a drill target (`pdctl drill --url`), seen only through its HTTP
 * API: `/v1/engines`, `/v1/rooms`, `/v1/journal` (followed for the chart), `/v1/stats`, the
 * health routes, and the admin route for faults (`inject_fault` needs engines started with
 * `--allow-fault-injection`; a bearer token from PDCTL_ADMIN_TOKEN when the server has one).
 *
 * Two things need the stack on this host, and are refused or skipped otherwise: signals to an
 * engine's process (by the pid `/v1/engines` reports, checked against the process's command
 * line first), and `journal verify` (read-only, on the file `/v1/stats` names).
 */
import { existsSync, readFileSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import { isPostgresJournal, openJournalReader, redactJournalUrl } from '../app/journal.ts';
import type { CommandName } from '../bus/protocol.ts';
import type { JournalStats, Timeline, VerifyReport } from '../journal/store.ts';
import {
  EVENT_TYPES,
  type EventType,
  type JournalEvent,
  type JournalEventOf,
} from '../room/events.ts';
import { type Room, reduce } from '../room/reducer.ts';
import { LIVE_STATES } from '../room/states.ts';
import {
  type BusView,
  type CanaryOutcome,
  type DrillTarget,
  type EngineView,
  InjectedFaults,
  type LiveRoom,
  outOfRotation,
  type RoomWatcher,
} from './target.ts';

const ROOM_EVENTS = EVENT_TYPES.filter((t) => t.startsWith('room.'));

/** The server at `--url` answered with an error, or not at all. */
export class TargetError extends Error {
  constructor(
    message: string,
    /** No answer at all (not running, wrong port): the CLI exits 4. */
    readonly unreachable = false,
  ) {
    super(message);
  }
}

interface EngineRow {
  id: string;
  role: 'prefill' | 'decode';
  state: string;
  pid: number;
  incarnation: string;
  heartbeatAgeMs: number;
  /** Heartbeats on its current connection. */
  heartbeats: number;
  freePages: number | null;
  totalPages: number;
  faultInjection?: boolean;
  status: string;
  cordon: { by: string; reason: string } | null;
  ejection: { reason: string } | null;
}

interface StatsBody {
  journal: JournalStats;
  bus: {
    endpoint?: string;
    dropped: Record<string, number>;
    loop: { restarts: number };
  };
}

export class RemoteTarget implements DrillTarget {
  readonly kind = 'remote';
  readonly base: string;
  readonly sameHost: boolean;
  private modelName = '';
  /** The journal file, as the server names it in `/v1/stats`. */
  journalPath = '';
  private readonly followers = new Set<AbortController>();

  private constructor(
    url: URL,
    private readonly token: string | null,
    sameHost?: boolean,
  ) {
    this.base = url.origin;
    this.sameHost = sameHost ?? isThisHost(url.hostname);
  }

  /** Connects to the server at `url`: it must answer `/v1/models` with the model it serves. */
  /**
   * `sameHost`: the server's journal file and processes are this machine's although its address is
   * not (test hosts: network namespaces sharing the file system); default: judged by the address.
   */
  static async connect(
    url: string,
    token: string | null,
    o: { sameHost?: boolean } = {},
  ): Promise<RemoteTarget> {
    let parsed: URL;
    try {
      parsed = new URL(url);
      if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new Error();
    } catch {
      throw new TargetError(
        `--url must be an http(s) URL like http://127.0.0.1:8080, got "${url}"`,
      );
    }
    const t = new RemoteTarget(parsed, token, o.sameHost);
    const models = await t.get<{ data: Array<{ id: string }> }>('/v1/models');
    const first = models.data[0];
    if (!first) throw new TargetError(`${t.base}/v1/models lists no model`);
    t.modelName = first.id;
    t.journalPath = (await t.get<StatsBody>('/v1/stats')).journal.path;
    return t;
  }

  get model(): string {
    return this.modelName;
  }

  async engines(): Promise<EngineView[]> {
    const body = await this.get<{ engines: EngineRow[] }>('/v1/engines');
    return body.engines.map((e) => ({
      id: e.id,
      role: e.role,
      pid: e.pid,
      incarnation: e.incarnation,
      live: e.state !== 'connecting',
      heartbeatAgeMs: e.heartbeats > 0 ? e.heartbeatAgeMs : null,
      freePages: e.freePages,
      totalPages: e.totalPages,
      faultInjection: e.faultInjection === true,
      outOfRotation: outOfRotation(e.id, e),
    }));
  }

  async liveRooms(): Promise<LiveRoom[]> {
    const body = await this.get<{ rooms: Room[] }>(
      `/v1/rooms?state=${LIVE_STATES.join(',')}&origin=all&limit=10000`,
    );
    return body.rooms.map(({ room, state, prefillEngine, decodeEngine }) => ({
      room,
      state,
      prefillEngine,
      decodeEngine,
    }));
  }

  async events<T extends EventType>(
    type: T,
    since: number,
    engine?: string,
  ): Promise<JournalEventOf<T>[]> {
    const q = new URLSearchParams({ type, since: String(since), limit: '10000' });
    if (engine !== undefined) q.set('engine', engine);
    const text = await this.text(`/v1/journal?${q}`);
    return text
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => JSON.parse(l) as JournalEventOf<T>);
  }

  async timeline(room: string): Promise<Timeline> {
    const res = await this.fetch(`/v1/rooms/${encodeURIComponent(room)}`);
    if (res.status === 404) {
      await res.arrayBuffer();
      return { room: null, events: [], spans: [] };
    }
    return (await this.body(res)) as Timeline;
  }

  async roomsSince(since: number): Promise<string[]> {
    const ids: string[] = [];
    let cursor: string | null = null;
    do {
      // Every origin, canaries included, as a drill's own stack is read.
      const q = new URLSearchParams({ since: String(since), origin: 'all', limit: '10000' });
      if (cursor) q.set('cursor', cursor);
      const page: { rooms: Room[]; nextCursor: string | null } = await this.get(`/v1/rooms?${q}`);
      for (const r of page.rooms) ids.push(r.room);
      cursor = page.nextCursor;
    } while (cursor);
    return ids;
  }

  private readonly faults = new InjectedFaults();

  clearFaults(): Promise<string[]> {
    return this.faults.clear(this);
  }

  async command(engine: string, command: CommandName, arg?: string): Promise<boolean> {
    this.faults.note(engine, command, arg);
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    const res = await this.fetch(`/v1/admin/engines/${encodeURIComponent(engine)}/commands`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ command, reason: arg ?? 'drill' }),
    });
    if (res.status === 404) {
      await res.arrayBuffer();
      return false;
    }
    await this.body(res);
    return true;
  }

  async signal(engine: string, sig: NodeJS.Signals): Promise<number> {
    if (!this.sameHost)
      throw new TargetError(
        `cannot signal ${engine}: the stack at ${this.base} is on another host (run the drill there)`,
      );
    const e = (await this.engines()).find((x) => x.id === engine);
    if (!e) throw new TargetError(`no engine ${engine} at ${this.base}`);
    // A pid is only a number: make sure it is still that engine's process before signalling it.
    const cmdline = `/proc/${e.pid}/cmdline`;
    if (existsSync('/proc/self/cmdline')) {
      const args = existsSync(cmdline) ? readFileSync(cmdline, 'utf8').split('\0') : [];
      if (!args.includes('engine') || !args.includes(engine))
        throw new TargetError(
          `pid ${e.pid} is not engine ${engine}'s process (${args.join(' ').slice(0, 120) || 'gone'}); not signalling it`,
        );
    }
    try {
      process.kill(e.pid, sig);
    } catch (err) {
      throw new TargetError(
        `cannot signal ${engine} (pid ${e.pid}): ${(err as Error).message}; run the drill as the user that runs pdctl serve`,
      );
    }
    return e.pid;
  }

  async ready(): Promise<boolean> {
    const res = await this.fetch('/health/ready');
    await res.arrayBuffer();
    return res.status === 200;
  }

  async canary(deadlineMs: number): Promise<CanaryOutcome> {
    let res = await this.fetch(`/health/deep?deadline_ms=${deadlineMs}`);
    // The server starts a client canary at most once a second; a 429 says when to ask again.
    for (let tries = 0; res.status === 429 && tries < 5; tries++) {
      await res.arrayBuffer();
      await new Promise((r) => setTimeout(r, 1000 * Number(res.headers.get('retry-after') ?? 1)));
      res = await this.fetch(`/health/deep?deadline_ms=${deadlineMs}`);
    }
    const r = (await res.json()) as Partial<CanaryOutcome>;
    return {
      ok: res.status === 200 && r.ok === true,
      ms: r.ms ?? Number.NaN,
      stage: r.stage ?? null,
      reason: r.reason ?? (res.status === 200 ? null : `HTTP ${res.status}`),
    };
  }

  /** The server's canary rooms look like any other client's from here. */
  isCanaryRoom(): boolean {
    return false;
  }

  async bus(): Promise<BusView> {
    const s = await this.get<StatsBody>('/v1/stats');
    const dropped = Object.values(s.bus.dropped).reduce((a, b) => a + b, 0);
    if (!s.bus.endpoint) throw new TargetError(`${this.base}/v1/stats does not name its bus`);
    // A wildcard bind is reached at the host the API is on.
    const host = new URL(this.base).hostname;
    const endpoint = s.bus.endpoint.replace(
      /^tcp:\/\/(0\.0\.0\.0|\*|\[::\])(?=:)/,
      `tcp://${host}`,
    );
    return { endpoint, dropped, loopRestarts: s.bus.loop.restarts };
  }

  async verify(): Promise<VerifyReport | string> {
    const path = this.journalPath;
    let at = path;
    if (isPostgresJournal(path)) {
      // /v1/stats names it without its password; PDCTL_JOURNAL may hold the whole URL.
      const full = process.env.PDCTL_JOURNAL;
      if (!full || redactJournalUrl(full) !== path) {
        return `the journal is in PostgreSQL (${path}): set PDCTL_JOURNAL to its URL, password included, to verify it from here`;
      }
      at = full;
    } else {
      if (!this.sameHost) return `the journal ${path} is on another host`;
      if (!existsSync(path)) return `the journal ${path} is not readable from here`;
    }
    const reader = openJournalReader(at);
    try {
      return await reader.verify();
    } finally {
      reader.close();
    }
  }

  watchRooms(watcher: RoomWatcher): () => void {
    const ac = new AbortController();
    this.followers.add(ac);
    const q = new URLSearchParams({
      follow: '1',
      since: String(Date.now()),
      type: ROOM_EVENTS.join(','),
      limit: '10000',
    });
    const rooms = new Map<string, Room>();
    const follow = async () => {
      const res = await this.fetch(`/v1/journal?${q}`, { signal: ac.signal }, 0);
      const reader = (res.body as ReadableStream<Uint8Array>).getReader();
      const decoder = new TextDecoder();
      let buffered = '';
      for (;;) {
        const { done, value } = await reader.read();
        if (done) return;
        buffered += decoder.decode(value, { stream: true });
        let cut = buffered.indexOf('\n');
        while (cut >= 0) {
          const line = buffered.slice(0, cut);
          buffered = buffered.slice(cut + 1);
          cut = buffered.indexOf('\n');
          if (line.trim() === '') continue;
          const ev = JSON.parse(line) as JournalEvent;
          if (!ev.room) continue;
          // Rooms created before the follow began are not folded: the chart starts with the drill.
          const before = rooms.get(ev.room) ?? null;
          const r = reduce(before, ev);
          if (!r.ok) continue;
          rooms.set(ev.room, r.room);
          if (before?.state !== r.room.state) watcher(ev.room, before?.state ?? null, r.room.state);
        }
      }
    };
    follow().catch(() => {
      // Ended by close, or the server went away: the chart stops there; the drill goes on.
    });
    return () => {
      ac.abort();
      this.followers.delete(ac);
    };
  }

  /** A drill against a running stack leaves the journal to the stack: nothing to record. */
  async record(): Promise<void> {}

  async close(): Promise<void> {
    for (const ac of this.followers) ac.abort();
    this.followers.clear();
  }

  // ── HTTP ────────────────────────────────────────────────────────────────────────────────

  private async fetch(path: string, init: RequestInit = {}, timeoutMs = 15_000): Promise<Response> {
    const signal =
      timeoutMs > 0
        ? init.signal
          ? AbortSignal.any([init.signal, AbortSignal.timeout(timeoutMs)])
          : AbortSignal.timeout(timeoutMs)
        : init.signal;
    try {
      // The token on every request: with one set, the query routes need it too.
      const headers = {
        ...(init.headers as Record<string, string> | undefined),
        ...(this.token ? { authorization: `Bearer ${this.token}` } : {}),
      };
      return await fetch(`${this.base}${path}`, { ...init, headers, signal });
    } catch (err) {
      const e = err as Error & { cause?: { code?: string; message?: string } };
      const cause = e.cause?.code ?? e.cause?.message;
      throw new TargetError(
        `cannot reach ${this.base}${path.split('?')[0]}: ${cause ? `${e.message} (${cause})` : e.message}. Is pdctl serve running there?`,
        true,
      );
    }
  }

  /** The JSON body of a 2xx answer; the server's own error message otherwise. */
  private async body(res: Response): Promise<unknown> {
    const text = await res.text();
    if (res.status >= 200 && res.status < 300) return text === '' ? null : JSON.parse(text);
    let message = text.slice(0, 300);
    try {
      message = (JSON.parse(text) as { error?: { message?: string } }).error?.message ?? message;
    } catch {
      // not JSON: the text as it came
    }
    throw new TargetError(`${res.url.replace(this.base, '')}: HTTP ${res.status}: ${message}`);
  }

  private async get<T>(path: string): Promise<T> {
    return (await this.body(await this.fetch(path))) as T;
  }

  private async text(path: string): Promise<string> {
    const res = await this.fetch(path);
    if (res.status !== 200) await this.body(res);
    return res.text();
  }
}

/** Whether `hostname` (from a URL) names this machine: loopback, or one of its addresses. */
function isThisHost(hostname: string): boolean {
  const h = hostname.replace(/^\[|\]$/g, '');
  if (h === 'localhost' || h === '::1' || /^127\./.test(h)) return true;
  return Object.values(networkInterfaces()).some((list) =>
    (list ?? []).some((a) => a.address === h),
  );
}
