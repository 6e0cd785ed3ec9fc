/**
 * `pdctl drill hostile-peer`: the bus attacks of docs/security.md against a serving stack. A peer holding
 * a stolen key forges hellos as the live decode engine; an admitted guest engine appends under
 * the ids the control plane will use to abort or fail live rooms, and for rooms it never held;
 * sends frames far over the size limit; connects under the prefill engine's routing id; sends
 * tokens for the clients' rooms and the ids that come next; and floods the bus with hellos and
 * frames. The stack must refuse all of it, journal none of it (the flood: once), keep its engines
 * and its clients, alter no answer, and still abort a room whose ids were aimed at.
 */
import { newKeyPair } from '../bus/admission.ts';
import { REGISTRATIONS_BURST } from '../control/engines/hello.ts';
import type { JournalEventOf } from '../room/events.ts';
import { isTerminal } from '../room/states.ts';
import type { DrillScenario } from './harness.ts';
import { errorsSeen } from './load.ts';
import { until } from './poll.ts';
import { RawEngine } from './raw-engine.ts';

const FORGED_HELLOS = 61;
const FLOOD_HELLOS = 1000;
const FLOOD_FRAMES = 50_000;

/** Room ids the control plane may hand out next, guessed from the newest one it has. */
function nextRoomIds(control: { liveRooms(): Iterable<{ room: string }> }): string[] {
  const newest = [...control.liveRooms()]
    .map((r) => r.room)
    .sort()
    .at(-1);
  const m = newest === undefined ? null : /^r-[0-9a-z]+-([0-9a-f]{6})$/.exec(newest);
  if (!m) return [];
  const counter = Number.parseInt(m[1] as string, 16);
  const out: string[] = [];
  for (let ms = Date.now(); ms < Date.now() + 3; ms++)
    for (let c = counter + 1; c <= counter + 4; c++)
      out.push(`r-${ms.toString(36)}-${c.toString(16).padStart(6, '0')}`);
  return out;
}

export const hostilePeer: DrillScenario = {
  name: 'hostile-peer',
  summary:
    "forged hellos as a live engine, appends under the control plane's event ids and for rooms the peer does not hold, oversized frames, a connection under an engine's routing id, injected tokens, and a hello and frame flood, while clients stream",
  remote: {
    unsupported:
      'it needs a key the stack admits, and only a stack the drill starts hands one out (against --url, malformed-frames shows that a stranger never gets in)',
  },
  // The room aimed at is held in `transferring` (a stalled transfer) until the drill aborts it at
  // the end: its deadline there must outlast every step, floods included, on a loaded machine.
  stack: { deadlinesMs: { transferring: 60_000 } },
  async run(ctx) {
    if (!ctx.local) throw new Error('hostile-peer needs a stack the drill starts');
    const { control, admission, journal } = ctx.local.stack;
    const serverKey = admission.server.publicKey;
    const decodeId = ctx.engineIds.decode[0] as string;
    const prefillId = ctx.engineIds.prefill[0] as string;
    const peers: RawEngine[] = [];
    const load = ctx.load();
    // A client the drill aborts later, once the peer has aimed at its room's ids. Its transfer is
    // held (a fault on that room alone), so that it stays live however fast the model is. The
    // fault reaches the prefill engine before the room does: one connection keeps order.
    const target = control.submit({ prompt: 'the river runs north', maxTokens: 8 });
    control.command(prefillId, 'inject_fault', target.room, 'stall');
    const targetDone = (async () => {
      try {
        for await (const _ of target) {
          /* drain */
        }
      } catch {
        /* it is aborted */
      }
    })();
    try {
      await until(async () => control.room(target.room)?.state === 'transferring', 10_000);
      const incarnation = control.engine(decodeId)?.incarnation;
      const drops = () => control.busStatus().dropped;
      const before = drops();
      const headBefore = await journal.headSeq();
      const faultAt = Date.now();

      // 1. Forged hellos: the prefill engine's key, stolen, claiming to be the decode engine.
      const thief = new RawEngine({
        endpoint: control.endpoint,
        engine: decodeId,
        role: 'decode',
        keys: admission.issue(prefillId),
        serverKey,
      });
      peers.push(thief);
      for (let i = 0; i < FORGED_HELLOS; i++) await thief.sayHello();
      ctx.mark(`fault: ${FORGED_HELLOS} hellos as ${decodeId}, signed with ${prefillId}'s key`);

      // 2. An admitted guest engine appends under the control plane's ids and for others' rooms.
      const guestKeys = newKeyPair();
      admission.allow('guest-d', guestKeys.publicKey);
      const guest = new RawEngine({
        endpoint: control.endpoint,
        engine: 'guest-d',
        role: 'decode',
        keys: guestKeys,
        serverKey,
        model: control.modelInfo.format,
      });
      peers.push(guest);
      // A pool of no pages: admitted, but never picked for a client's room (it would not serve it).
      const noPages = { pages: 0, kv: { baseBytes: 0, bytesPerToken: 64, decodeGrows: true } };
      await guest.join(noPages);
      const live = [...control.liveRooms()].filter((r) => !isTerminal(r.state)).slice(0, 50);
      let forged = 0;
      for (const r of live) {
        for (const id of [
          `${r.room}:aborted`,
          `${r.room}:orphaned`,
          `${r.room}:deadline:${r.state}`,
        ]) {
          await guest.append(id, 'room.completed', r.room, { tokens: 1, finishReason: 'stop' });
          forged++;
        }
      }
      for (let i = 0; i < 500; i++) {
        await guest.append(`junk-${i}`, 'room.failed', `r-forged-${i}`, {
          reason: 'junk',
          stage: 'decoding',
          detectedBy: 'guest',
        });
        forged++;
      }
      ctx.mark(`fault: ${forged} forged appends from an admitted guest engine`);

      // 3. Frames far over the limit.
      await guest.sendRaw(['append', Buffer.alloc(2 << 20, 0x91)]);
      await guest.sendRaw(['hello', Buffer.alloc(10 << 20, 0x80)]);
      ctx.mark('fault: appends of 2 MiB and a hello of 10 MiB');

      const settled = await until(async () => {
        const d = drops();
        const by = (k: keyof typeof d) => (d[k] ?? 0) - (before[k] ?? 0);
        return (
          by('unauthorized') + by('rate_limited') >= FORGED_HELLOS &&
          by('not_owner') >= forged &&
          by('too_large') >= 2
        );
      }, 15_000);
      const after = drops();
      const delta = (k: keyof typeof after) => (after[k] ?? 0) - (before[k] ?? 0);
      // Past its connection's hello quota, a forged hello is dropped unread (rate_limited).
      const refusedHellos = delta('unauthorized') + delta('rate_limited');
      ctx.check({
        name: 'forged hellos refused; the real engine keeps its registration',
        ok: refusedHellos >= FORGED_HELLOS && control.engine(decodeId)?.incarnation === incarnation,
        figure: {
          hellos: FORGED_HELLOS,
          refused: delta('unauthorized'),
          droppedOverQuota: delta('rate_limited'),
        },
        detail: `${decodeId} still incarnation ${incarnation}`,
      });
      // Its registration is journaled (it is admitted); nothing it appended may be.
      const guestEvents = (await journal.tail({ engine: 'guest-d', limit: 10 })).filter(
        (e) => e.type !== 'engine.registered',
      );
      const headAfter = await journal.headSeq();
      ctx.check({
        name: 'no forged append reached the journal',
        ok: settled === true && delta('not_owner') >= forged && guestEvents.length === 0,
        figure: {
          forged,
          refused: delta('not_owner'),
          journaledFromGuest: guestEvents.length,
          journalGrowth: headAfter - headBefore,
        },
        detail: 'refused on the bus; the journal grew only with the clients’ own rooms',
      });
      ctx.check({
        name: 'oversized frames dropped; the bus loop lives',
        ok: delta('too_large') >= 2 && control.busStatus().loop.restarts === 0,
        figure: { tooLarge: delta('too_large'), loopRestarts: control.busStatus().loop.restarts },
        detail: 'each counted as too_large',
      });

      // 4. A connection under the prefill engine's routing id as GET /v1/engines shows it.
      const prefillIncarnation = control.engine(prefillId)?.incarnation;
      const taker = new RawEngine({
        endpoint: control.endpoint,
        engine: 'guest-d',
        role: 'prefill',
        keys: guestKeys,
        serverKey,
        routingId: `${prefillId}/${prefillIncarnation}`,
      });
      peers.push(taker);
      ctx.mark(`fault: a connection under ${prefillId}'s public routing id`);

      // 5. Tokens for the clients' rooms, and for the room ids that come next (guessed from the
      // newest one: the same counter and millisecond scheme the ids follow).
      const notOwnerBefore = drops().not_owner ?? 0;
      let injected = 0;
      const injectUntil = Date.now() + 2000;
      while (Date.now() < injectUntil) {
        for (const room of [...control.liveRooms()].map((r) => r.room).concat(nextRoomIds(control)))
          for (let index = 0; index < 3; index++) {
            await guest.tokens(room, index, ' INJECTED');
            injected++;
          }
        await ctx.sleep(10);
      }
      ctx.mark(`fault: ${injected} token chunks for rooms the guest does not hold`);

      // 6. A flood: hellos as ever new processes, then frames as fast as the socket takes them.
      const healthy = [...ctx.engineIds.prefill, ...ctx.engineIds.decode];
      const incarnationsBefore = healthy.map((e) => control.engine(e)?.incarnation);
      const floodHead = await journal.headSeq();
      const floodAt = Date.now();
      for (let i = 0; i < FLOOD_HELLOS; i++)
        await guest.sayHello({ incarnation: `flood-${i}`, ...noPages });
      for (let i = 0; i < FLOOD_FRAMES; i++) await guest.sendRaw(['heartbeat', Buffer.alloc(8)]);
      ctx.mark(`fault: ${FLOOD_HELLOS} hellos and ${FLOOD_FRAMES} frames from the guest`);

      await ctx.sleep(2000);
      let takerGot = 0;
      try {
        await taker.next(undefined, 200);
        takerGot = 1;
      } catch {
        takerGot = 0;
      }
      ctx.check({
        name: 'no message of another engine reached a connection under its routing id',
        ok: takerGot === 0 && control.engine(prefillId)?.incarnation === prefillIncarnation,
        figure: { messages: takerGot },
        detail: `${prefillId}'s rooms and prompts went to ${prefillId} alone`,
      });
      const altered = load.records.filter((r) => r.text.includes('INJECTED'));
      const refusedTokens = (drops().not_owner ?? 0) - notOwnerBefore;
      ctx.check({
        name: 'no client answer altered by tokens from an engine that does not hold the room',
        ok: altered.length === 0 && refusedTokens >= injected,
        figure: { injected, refused: refusedTokens, altered: altered.length },
        detail: 'every chunk refused (not_owner) before it reached a stream',
      });
      const sinceFlood = (await journal.tail({ limit: 5000 })).filter((e) => e.seq > floodHead);
      const fromGuest = sinceFlood.filter((e) => e.engine === 'guest-d');
      const throttles = fromGuest.filter(
        (e) => e.type === 'recovery.action' && e.data.action === 'throttle',
      );
      ctx.check({
        name: 'the flooding engine is throttled and journaled once; the journal does not grow with the flood',
        ok: throttles.length === 1 && fromGuest.length <= 2 * REGISTRATIONS_BURST + 2,
        figure: {
          hellos: FLOOD_HELLOS,
          frames: FLOOD_FRAMES,
          journaledFromGuest: fromGuest.length,
          throttleEvents: throttles.length,
          droppedOverQuota: drops().rate_limited ?? 0,
        },
        detail: `${throttles.length} throttle record(s) and ${fromGuest.length} events of guest-d since the flood began`,
      });
      const resets = sinceFlood.filter(
        (e): e is JournalEventOf<'recovery.action'> =>
          e.type === 'recovery.action' &&
          e.engine !== null &&
          healthy.includes(e.engine) &&
          e.ts >= floodAt,
      );
      ctx.check({
        name: 'no healthy engine was reset or restarted over the flood',
        ok:
          resets.length === 0 &&
          healthy.every((e, i) => control.engine(e)?.incarnation === incarnationsBefore[i]),
        figure: { recoveryActions: resets.length },
        detail:
          resets.length === 0
            ? 'the stall detector saw a busy control plane, not wedged engines'
            : resets.map((e) => `${e.engine}: ${e.data.reason}`).join('; '),
      });

      // The control plane's own abort of the targeted room still ends it.
      const abortAt = Date.now();
      const res = await control.abort(target.room, 'drill: after forged ids', 'drill');
      const aborted = await until(
        async () => (await journal.timeline(target.room)).room?.state === 'aborted',
        10_000,
      );
      ctx.check({
        name: 'a room whose ids were aimed at is still aborted',
        ok: res.status === 'applied' && aborted === true,
        figure: { abortMs: Date.now() - abortAt },
        detail: `${target.room}: abort_requested ${res.status}, then ${aborted ? 'aborted' : 'not aborted'}`,
      });
      const during = load.records.filter((r) => r.endedAt >= faultAt);
      const failed = during.filter((r) => r.outcome !== 'completed');
      ctx.check({
        name: 'no client request failed meanwhile',
        ok: failed.length === 0 && during.length > 0,
        figure: { requests: during.length, failed: failed.length },
        detail: failed.length === 0 ? 'the load ran on through every fault' : errorsSeen(failed),
      });
    } finally {
      for (const p of peers) p.close();
      // The guest holds no pages and sends no heartbeats: it is not one of the stack's engines.
      control.forgetEngine('guest-d');
      const room = control.room(target.room);
      if (room && !isTerminal(room.state)) await control.abort(target.room, 'drill ended', 'drill');
      await targetDone;
      control.command(prefillId, 'inject_fault', null, 'none');
    }
  },
};
