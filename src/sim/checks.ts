/**
 * The simulator's checks beyond the journal's own invariants (invariants.ts): every client's text
 * against the reference model's, the engines no fault touched left alone, and after every commit
 * the control plane's room book against the journal's fold and its page map against every decode
 * engine's allocator.
 */
import { StartState } from '../control/checkpoint/state.ts';
import { FLOW_DEFAULTS } from '../control/flow/flow-control.ts';
import { DeterministicModel, generateInProcess } from '../model/deterministic.ts';
import type { JournalEvent } from '../room/events.ts';
import { type Room, reduce } from '../room/reducer.ts';
import { isTerminal } from '../room/states.ts';
import { type ClientOutcome, isLimit } from './client.ts';
import type { PlannedFault } from './faults.ts';
import type { Fleet } from './fleet.ts';
import type { Violation } from './invariants.ts';

/**
 * The control plane against the journal after every commit: its page map against each decode
 * engine's allocator (`checkPages`), and its room book against the journal's own fold (the
 * in-memory disk's). A commit is published to every subscriber in one go — the control plane
 * first, this check after — so once that is done, every room the commit touched that the book
 * still shows must be as the journal has it, whole (the reducer's every field).
 */
export function watchControl(fleet: Fleet, out: Violation[]): void {
  const touched = new Set<string>();
  const mapped = new Set<string>();
  const check = () => {
    checkPages(fleet, touched, mapped, out);
    for (const id of touched) {
      const shown = fleet.control.room(id);
      if (shown === undefined || out.length >= 10) continue;
      const folded = fleet.disk.rooms.get(id);
      if (folded !== undefined && sameRoom(shown, folded)) continue;
      const a = JSON.stringify(shown);
      const b = JSON.stringify(folded ?? null);
      if (a !== b)
        out.push({
          invariant: 'book_equals_journal',
          room: id,
          seq: 0,
          detail: `at ${fleet.clock.monotonic()} ms the control plane shows ${a.slice(0, 300)}; the journal folds ${b.slice(0, 300)}`,
        });
    }
    touched.clear();
  };
  const watch = () =>
    fleet.journal.subscribe(fleet.disk.headSeq(), (ev) => {
      if (ev.room === null) return;
      if (touched.size === 0) queueMicrotask(check);
      touched.add(ev.room);
    });
  watch();
  // A restarted control plane has a journal of its own, opened on the same disk.
  fleet.onControlStarted(() => {
    watch();
    checkRestored(fleet, out);
  });
}

/**
 * A started control plane against the whole journal: the prefix index and the cordons it
 * restored (from its state checkpoint and the events after it: control/checkpoint) are what a
 * fold of every committed event gives.
 */
function checkRestored(fleet: Fleet, out: Violation[]): void {
  const whole = new StartState();
  for (const ev of fleet.disk.events) {
    whole.index.fold(ev);
    whole.fold(ev);
  }
  const { control } = fleet;
  const shown = {
    index: control.router.index.snapshot(),
    cordons: Object.fromEntries(control.registry.cordons.all()),
  };
  const folded = { index: whole.index.snapshot(), cordons: Object.fromEntries(whole.cordons) };
  const a = JSON.stringify(shown);
  const b = JSON.stringify(folded);
  if (a !== b)
    out.push({
      invariant: 'restored_state_equals_journal',
      room: null,
      seq: whole.seq,
      detail: `at ${fleet.clock.monotonic()} ms (checkpoint ${JSON.stringify(control.startup.checkpoint)}) the control plane restored ${a.slice(0, 300)}; the journal folds ${b.slice(0, 300)}`,
    });
}

/**
 * Whether two folds of a room are the same, field for field (a field's array or object by its
 * own fields): what comparing their JSON says, without writing it for every commit.
 */
function sameRoom(a: Room, b: Room): boolean {
  const keys = Object.keys(a) as Array<keyof Room>;
  if (keys.length !== Object.keys(b).length) return false;
  for (const k of keys) {
    const x = a[k];
    const y = b[k];
    if (x === y) continue;
    if (typeof x !== 'object' || typeof y !== 'object' || x === null || y === null) return false;
    const xs = Object.entries(x);
    if (xs.length !== Object.keys(y).length) return false;
    for (const [f, v] of xs) if ((y as Record<string, unknown>)[f] !== v) return false;
  }
  return true;
}

/**
 * The control plane's page map against each decode engine's allocator: a page an engine holds for
 * a room is one the map holds for that room — or, for a room whose pages the map has never held
 * (it chose none, and the room's `room.bootstrapped` has not committed), one it holds for no
 * room. The map may call a page free only once the engine freed it (pages/page-map.ts): a page
 * the engine holds that the map gives another room, or calls free once it knew the room's pages,
 * is one it could reserve for two live rooms. And the map never counted a conflict. `rooms`: those
 * a commit touched — a page the map frees or gives away is freed or given at a commit of the room
 * that held it or takes it. `mapped`: the `engine/incarnation/room`s the map has been seen holding
 * pages for, kept across calls.
 */
export function checkPages(
  fleet: Fleet,
  rooms: Iterable<string>,
  mapped: Set<string>,
  out: Violation[],
): void {
  if (!fleet.controlProcess.alive || out.length >= 10) return;
  const { book } = fleet.control;
  if (book.pageConflicts > 0 && !out.some((v) => v.invariant === 'page_map_agrees'))
    out.push({
      invariant: 'page_map_agrees',
      room: null,
      seq: 0,
      detail: `the control plane's page map counted ${book.pageConflicts} conflicts`,
    });
  for (const sim of fleet.engines.values()) {
    if (sim.role !== 'decode' || !sim.process.alive) continue;
    // Only while the control plane delivers to this incarnation: one it fenced or lost may live on
    // (stopped) holding pages the control plane released for it — by design, since no room is
    // reserved in its pool again (simulator, control-kill,control-freeze,disk-full,relapse seed 209).
    const session = fleet.control.registry.get(sim.id);
    if (!session || session.incarnation !== sim.incarnation || !session.delivery.live) continue;
    const held = book.decodePageOwners(sim.id);
    if (!held || held.incarnation !== sim.incarnation) continue;
    const pool = `${sim.id}/${sim.incarnation}/`;
    const { allocator } = sim.engine.core;
    for (const room of rooms) {
      if (held.pages.has(room)) mapped.add(pool + room);
      for (const page of allocator.pagesOf(room) ?? []) {
        const owner = held.owners.get(page);
        if (owner === room || (owner === undefined && !mapped.has(pool + room))) continue;
        out.push({
          invariant: 'page_map_agrees',
          room,
          seq: 0,
          detail: `at ${fleet.clock.monotonic()} ms ${sim.id} holds page ${page} for ${room}; the control plane's page map ${owner === undefined ? 'calls it free' : `holds it for ${owner}`}`,
        });
        return;
      }
    }
  }
}

/** What the journal says was done to an engine that was at fault: none may name an untouched one. */
const BLAMED = new Set([
  'engine.exited',
  'engine.lost',
  'engine.stalled',
  'engine.cordoned',
  'engine.ejected',
]);

/**
 * The engines no fault touched: started once, never exited, stalled, lost or cordoned. And with
 * no fault at all, no client whose request failed; with only faults that move rooms (`onlyMoves`:
 * kills, retirements), no client that got a room failed and no room waited out a deadline.
 */
export function spared(
  events: readonly JournalEvent[],
  hit: ReadonlySet<string>,
  anyFault: boolean,
  onlyMoves: boolean,
  outcomes: readonly ClientOutcome[],
): Violation[] {
  const out: Violation[] = [];
  const starts = new Map<string, Set<string>>();
  // The ladder restarts every engine when two or more stalled within a minute (the fault is
  // likelier in what they share): the untouched ones' restarts are then by design — but only
  // when the engines whose stalls it names were all ones the faults hit.
  let stackRestarted = false;
  for (const ev of events) {
    if (ev.type === 'recovery.action' && ev.data.action === 'restart_stack') {
      const named = ev.data.stalled ?? [];
      stackRestarted ||= named.length >= 2 && named.every((e) => hit.has(e));
    }
    if (ev.engine === null || hit.has(ev.engine)) continue;
    const restarted =
      stackRestarted &&
      (ev.type === 'engine.registered' || (ev.type === 'engine.exited' && ev.data.expected));
    if (restarted) continue;
    // A restarted control plane registers the same incarnation again: only new ones count.
    if (ev.type === 'engine.registered')
      starts.set(ev.engine, (starts.get(ev.engine) ?? new Set()).add(ev.data.incarnation));
    if (BLAMED.has(ev.type))
      out.push({
        invariant: 'untouched_engine_spared',
        room: null,
        seq: ev.seq,
        detail: `${ev.type} ${ev.engine} (${JSON.stringify(ev.data).slice(0, 200)}), though no fault hit it`,
      });
  }
  for (const [engine, incarnations] of starts)
    if (incarnations.size > 1)
      out.push({
        invariant: 'untouched_engine_spared',
        room: null,
        seq: 0,
        detail: `${engine} registered ${incarnations.size} incarnations, though no fault hit it`,
      });
  // A killed engine's rooms move at once, and it comes back; a retired engine's rooms not begun
  // move, and it finishes the rest: with no other fault, no client that got a room fails, and no
  // room waits out a deadline. (A request that came while every engine of a role was down or
  // retiring is refused: that is no defect; nor is one held to its tenant's own limits.)
  if (!anyFault)
    for (const o of outcomes)
      if (o.error !== null && o.request.action === null && !isLimit(o.code))
        out.push({
          invariant: 'no_failure_without_fault',
          room: null,
          seq: 0,
          detail: `${o.request.id}: ${o.error}`,
        });
  if (anyFault && onlyMoves) {
    for (const o of outcomes)
      if (o.error !== null && o.request.action === null && o.admitted)
        out.push({
          invariant: 'kill_loses_no_stream',
          room: null,
          seq: 0,
          detail: `${o.request.id}: ${o.error}`,
        });
    for (const ev of events)
      if (ev.type === 'room.failed' && ev.data.reason === 'deadline_exceeded')
        out.push({
          invariant: 'kill_leaves_no_room_waiting',
          room: ev.room,
          seq: ev.seq,
          detail: `failed deadline_exceeded in ${ev.data.stage}`,
        });
  }
  return out;
}

const reference = new DeterministicModel();

/**
 * Outlier ejection never takes out more than half of a role, nor its last engine, whatever fails
 * (outliers.ts `maxEjectedShare`): where every engine of a role fails at once — a bad model pushed
 * to all of them — the fault is in what they share, and ejecting them would empty the role.
 * Ejections live in the control plane: a new one (`journal.opened`) starts with none.
 */
export function roleKeptInRotation(events: readonly JournalEvent[]): Violation[] {
  const roles = new Map<string, string>();
  const out = new Set<string>();
  const found: Violation[] = [];
  for (const ev of events) {
    if (ev.type === 'journal.opened') out.clear();
    else if (ev.type === 'engine.registered' && ev.engine !== null)
      roles.set(ev.engine, (ev.data as { role: string }).role);
    else if (ev.type === 'engine.returned' && ev.engine !== null) out.delete(ev.engine);
    else if (ev.type === 'engine.ejected' && ev.engine !== null) {
      out.add(ev.engine);
      const role = roles.get(ev.engine);
      const all = [...roles].filter(([, r]) => r === role).map(([e]) => e);
      const ejected = all.filter((e) => out.has(e));
      if (ejected.length > Math.floor(all.length / 2) || ejected.length >= all.length)
        found.push({
          invariant: 'role_kept_in_rotation',
          room: null,
          seq: ev.seq,
          detail: `${ejected.join(', ')} of ${role} engines ${all.join(', ')} ejected at once`,
        });
    }
  }
  return found;
}

/** Lies an engine tells before the outlier detector must have taken it out (5 in a row, twice). */
const LIES_TO_EJECTION = 10;

/**
 * A lying engine is the one taken out of rotation: where a lie was the run's only fault, the
 * liar told at least `LIES_TO_EJECTION` of them and its role has another engine to take its
 * rooms, the journal has it ejected. (Its victims' sparing is `spared`'s.)
 */
export function liarsOut(
  events: readonly JournalEvent[],
  plan: readonly PlannedFault[],
  lied: ReadonlyMap<string, number>,
  roleOf: (engine: string) => string | undefined,
): Violation[] {
  // A liar whose words fail rooms: blaming its peers, or a prefill engine saying its transfers
  // hold bytes they do not (`phantom`). Other shapes are refused, or cost nothing.
  const f = plan[0];
  const phantom =
    f?.kind === 'lie-protocol' && f.shape === 'phantom' && roleOf(f.target ?? '') === 'prefill';
  if (f === undefined || plan.length !== 1 || !(f.kind === 'lie' || phantom)) return [];
  const liar = f.target as string;
  const peers = new Set(
    events.filter((e) => e.type === 'engine.registered' && e.engine !== liar).map((e) => e.engine),
  );
  const role = roleOf(liar);
  const spare = [...peers].some((e) => e !== null && roleOf(e) === role);
  if (!spare || (lied.get(liar) ?? 0) < LIES_TO_EJECTION) return [];
  if (events.some((e) => e.type === 'engine.ejected' && e.engine === liar)) return [];
  return [
    {
      invariant: 'liar_ejected',
      room: null,
      seq: 0,
      detail: `${liar} told ${lied.get(liar)} lies about its peers and was never ejected`,
    },
  ];
}

/**
 * Every client's text against the reference model's for its request: whole when answered, a
 * prefix of it when the client left or the room ended early (no token duplicated, missing, or
 * from another room — a first token the prefill engine sent is the model's, and what follows it
 * continues it); and nothing streamed ahead of what the journal committed (`early`).
 */
export function answers(outcomes: readonly ClientOutcome[]): Violation[] {
  const out: Violation[] = [];
  for (const o of outcomes) {
    if (o.early)
      out.push({
        invariant: 'streamed_only_committed',
        room: null,
        seq: 0,
        detail: `${o.request.id} was sent tokens of room ${o.early}: past its first token, before its KV transfer was committed`,
      });
    const want = generateInProcess(reference, o.request.prompt, o.request.maxTokens).text;
    const whole = o.error === null && o.request.action === null;
    const ok = whole ? o.text === want : want.startsWith(o.text);
    if (!ok)
      out.push({
        invariant: whole ? 'answer_is_the_models' : 'answer_is_a_prefix_of_the_models',
        room: null,
        seq: 0,
        detail: `${o.request.id}: got ${JSON.stringify(o.text.slice(0, 80))}, the model says ${JSON.stringify(want.slice(0, 80))}`,
      });
  }
  return out;
}

/** How long past a state's deadline a room may be seen leaving it: the watchdog's tick and a commit. */
const DEADLINE_SLACK_MS = 1000;

/**
 * Every room left each state within that state's deadline (+ `DEADLINE_SLACK_MS`): the watchdog
 * fails what overstays whatever else is broken (docs/design.md §9), as the drills check of real
 * processes. Excused: a span that overlaps a window in which nothing could fail it — the journal
 * refusing writes, the control plane stopped or dead (`excused`, unix ms).
 */
export function withinDeadlines(
  events: readonly JournalEvent[],
  excused: ReadonlyArray<{ from: number; to: number }>,
): Violation[] {
  const out: Violation[] = [];
  const rooms = new Map<string, Room>();
  for (const ev of events) {
    if (ev.room === null || ev.type === 'room.event_rejected' || !ev.type.startsWith('room.'))
      continue;
    const before = rooms.get(ev.room) ?? null;
    const r = reduce(before, ev);
    if (!r.ok) continue;
    rooms.set(ev.room, r.room);
    if (!before || before.state === r.room.state || isTerminal(before.state)) continue;
    const allowed = before.deadlinesMs[before.state as keyof Room['deadlinesMs']];
    const from = before.stateSince;
    const heldMs = ev.ts - from;
    if (allowed === undefined || heldMs <= allowed + DEADLINE_SLACK_MS) continue;
    if (excused.some((w) => from < w.to && ev.ts > w.from)) continue;
    out.push({
      invariant: 'states_within_deadlines',
      room: ev.room,
      seq: ev.seq,
      detail: `${before.state} held ${heldMs} ms, its deadline ${allowed} ms (left by ${ev.type})`,
    });
    if (out.length >= 10) break;
  }
  return out;
}

/**
 * No request waited in flow control's queue past its band's time-to-live: every room's
 * `room.created.waitedMs` is at most it (control/flow/: one past its deadline is answered, not
 * tried).
 */
export function waitsWithinTtl(events: readonly JournalEvent[]): Violation[] {
  const out: Violation[] = [];
  for (const ev of events) {
    if (ev.type !== 'room.created' || ev.data.waitedMs === undefined) continue;
    const band = ev.data.band ?? 'interactive';
    const ttl = FLOW_DEFAULTS.queueTtlMs[band];
    if (ev.data.waitedMs <= ttl) continue;
    out.push({
      invariant: 'waits_within_ttl',
      room: ev.room,
      seq: ev.seq,
      detail: `${ev.data.requestId ?? 'a request'} waited ${ev.data.waitedMs} ms for its room, its ${band} time-to-live ${ttl} ms`,
    });
    if (out.length >= 10) break;
  }
  return out;
}
