/**
 * `pdctl drill hostile-peer`: the bus attacks of docs/security.md against a serving stack. A peer holding
 * a stolen key forges hellos as the live decode engine; an admitted guest engine appends under
 * the ids the control plane will use to abort or fail live rooms, and for rooms it never held; and
 * it sends frames far over the size limit. The stack must refuse all of it, journal none of it,
 * keep its engines and its clients, and still abort a room whose ids were aimed at.
 */
import { newKeyPair } from '../bus/admission.ts';
import { isTerminal } from '../journal/states.ts';
import type { DrillScenario } from './harness.ts';
import { errorsSeen } from './load.ts';
import { until } from './poll.ts';
import { RawEngine } from './raw-engine.ts';

const FORGED_HELLOS = 61;

export const hostilePeer: DrillScenario = {
  name: 'hostile-peer',
  summary:
    "forged hellos as a live engine, appends under the control plane's event ids and for rooms the peer does not hold, and oversized frames, while clients stream",
  remote: {
    unsupported:
      'it needs a key the stack admits, and only a stack the drill starts hands one out (against --url, malformed-frames shows that a stranger never gets in)',
  },
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
      await guest.join({ pages: 0, kv: { baseBytes: 0, bytesPerToken: 64, decodeGrows: true } });
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
        return (
          (d.unauthorized ?? 0) - (before.unauthorized ?? 0) >= FORGED_HELLOS &&
          (d.not_owner ?? 0) - (before.not_owner ?? 0) >= forged &&
          (d.too_large ?? 0) - (before.too_large ?? 0) >= 2
        );
      }, 15_000);
      const after = drops();
      const delta = (k: keyof typeof after) => (after[k] ?? 0) - (before[k] ?? 0);
      ctx.check({
        name: 'forged hellos refused; the real engine keeps its registration',
        ok:
          delta('unauthorized') >= FORGED_HELLOS &&
          control.engine(decodeId)?.incarnation === incarnation,
        figure: { hellos: FORGED_HELLOS, refused: delta('unauthorized') },
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

      await ctx.sleep(2000);
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
