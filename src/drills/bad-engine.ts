/**
 * `pdctl drill bad-engine`: one faulty engine must never cost the fleet a restart, nor its clients
 * their answers (issue 40). Under steady load on 2 prefill and 2 decode engines:
 *
 *   - prefill-1 corrupts every KV transfer it makes (its rooms fail `kv_checksum_mismatch`): they
 *     are tried again on another pair, and prefill-1 is ejected as an outlier;
 *   - an admitted decode engine names decode-0's KV pool in its hello: refused;
 *   - an admitted prefill engine with no pages heartbeats, live and idle: given no room;
 *   - decode-1's model compute hangs, is restarted by the ladder, and hangs again at once: it is
 *     cordoned, and no other engine is restarted.
 *
 * It checks that the healthy engines keep their pids and incarnations, that at least 99 % of the
 * client requests succeed, that each bad engine is ejected, refused, passed over or cordoned
 * within its bound, that no page is reserved to two rooms, and that the journal says who was
 * blamed and why. `--no-outlier-ejection` and `--retry-limit 0` on the stack it starts give the
 * figure to compare (docs/benchmarks.md).
 */
import type { DrillContext, StackScenario } from './harness.ts';
import { errorsSeen } from './load.ts';
import { until } from './poll.ts';
import { RawEngine } from './raw-engine.ts';
import { enginePids, firstEvent, injectFault } from './scenarios.ts';

/** How long each bad engine may take to be taken out of rotation, from its fault. */
export const BAD_ENGINE_BOUNDS_MS = { ejected: 30_000, cordoned: 30_000 } as const;

export const badEngine: StackScenario = {
  name: 'bad-engine',
  summary:
    'a prefill engine that corrupts every transfer, a decode engine naming another’s pool, one with no pages, one that hangs again right after its restart: cordoned or ejected, never the fleet restarted',
  remote: {
    unsupported:
      'it admits engines with keys of its own and signals processes: it starts its own stack',
  },
  defaultClients: 8,
  stack: { prefillEngines: 2, decodeEngines: 2 },
  async run(ctx) {
    const local = ctx.local;
    if (!local) throw new Error('bad-engine needs the stack it starts');
    const { control } = local.stack;
    const [good, bad] = ['prefill', 'decode'].map((role) =>
      ctx.engineIds[role as 'prefill' | 'decode'].slice(0, 2),
    ) as [string[], string[]];
    const healthy = [good[0], bad[0]] as string[];
    const [corrupt, hangs] = [good[1], bad[1]] as [string, string];
    const before = await ctx.target.engines();
    const kept = new Map(
      before.filter((e) => healthy.includes(e.id)).map((e) => [e.id, `${e.pid}/${e.incarnation}`]),
    );
    const load = ctx.load();
    await ctx.sleep(1500);
    const startedAt = Date.now();

    // 1. Every transfer of the second prefill engine arrives corrupted.
    await injectFault(ctx, corrupt, 'corrupt');
    ctx.mark(`fault: every KV transfer of ${corrupt} arrives corrupted`);

    // 2. An admitted decode engine names the first decode engine's pool.
    const d0 = control.registry.get(bad[0] as string);
    if (!d0) throw new Error(`${bad[0]} is not registered`);
    const impostor = admitted(ctx, 'decode-impostor', 'decode');
    await impostor.sayHelloClaiming(d0);
    const nack = (await impostor.next('nack').catch(() => null)) as {
      payload: { code: string };
    } | null;
    ctx.mark(
      `decode-impostor said hello naming ${bad[0]}'s pool: ${nack?.payload.code ?? 'no answer'}`,
    );

    // 3. An admitted prefill engine with no pages, live and idle.
    const empty = admitted(ctx, 'prefill-nopages', 'prefill');
    await empty.join({ pages: 0, pool: '/drill-prefill-nopages' });
    const beating = setInterval(() => void empty.heartbeat().catch(() => {}), 200);
    ctx.mark('prefill-nopages joined with no pages, heartbeating');

    // 4. The second decode engine hangs, is restarted, and hangs again.
    const hangAt = Date.now();
    await injectFault(ctx, hangs, 'compute_hang');
    ctx.mark(`fault: ${hangs}'s model compute hangs`);
    const restarted = await firstEvent(ctx, 'engine.recovered', hangs, hangAt, 30_000);
    ctx.mark(
      restarted ? `${hangs} back after ${String(restarted.data.rung)}` : `${hangs} not back`,
      restarted?.ts,
    );
    const relapseAt = Date.now();
    if (restarted) await injectFault(ctx, hangs, 'compute_hang').catch(() => {});
    ctx.mark(`fault: ${hangs} hangs again`);
    const cordoned = await firstEvent(
      ctx,
      'engine.cordoned',
      hangs,
      relapseAt,
      BAD_ENGINE_BOUNDS_MS.cordoned,
    );
    if (cordoned) ctx.mark(`${hangs} cordoned: ${String(cordoned.data.evidence)}`, cordoned.ts);
    const ejected = await until(
      async () => (await ctx.target.events('engine.ejected', startedAt, corrupt))[0],
      Math.max(0, startedAt + BAD_ENGINE_BOUNDS_MS.ejected - Date.now()),
    );
    if (ejected) ctx.mark(`${corrupt} ejected: ${String(ejected.data.reason)}`, ejected.ts);
    await ctx.sleep(1500);
    await load.stop();
    clearInterval(beating);
    empty.close();
    impostor.close();
    await injectFault(ctx, corrupt, 'none').catch(() => {});
    await ctx.target.command(hangs, 'inject_fault', 'none').catch(() => false);

    const records = load.records;
    const ok = records.filter((r) => r.outcome === 'completed').length;
    const share = records.length === 0 ? 0 : ok / records.length;
    ctx.check({
      name: 'at least 99 % of client requests succeeded while the bad engines ran',
      ok: records.length > 0 && share >= 0.99,
      figure: { requests: records.length, succeeded: ok, percent: Math.round(share * 1000) / 10 },
      detail:
        ok === records.length
          ? 'every request answered'
          : `failed: ${errorsSeen(records.filter((r) => r.outcome !== 'completed'))}`,
    });
    const after = await ctx.target.engines();
    const changed = [...kept].filter(([id, was]) => {
      const now = after.find((e) => e.id === id);
      return !now || `${now.pid}/${now.incarnation}` !== was;
    });
    ctx.check({
      name: 'no healthy engine restarted',
      ok: changed.length === 0,
      figure: { engines: kept.size, restarted: changed.length },
      detail:
        changed.length === 0
          ? `${healthy.join(', ')} kept their pids and incarnations`
          : `restarted: ${changed.map(([id]) => id).join(', ')}`,
    });
    const stack = (await ctx.target.events('recovery.action', startedAt)).filter(
      (e) => e.data.action === 'restart_stack',
    );
    ctx.check({
      name: `the stalling engine cordoned within ${BAD_ENGINE_BOUNDS_MS.cordoned / 1000} s of its relapse, the fleet not restarted`,
      ok: cordoned !== null && cordoned.data.by === 'ladder' && stack.length === 0,
      figure: {
        cordonedAfterMs: cordoned ? cordoned.ts - relapseAt : 'never',
        restartStack: stack.length,
      },
      detail: cordoned
        ? `engine.cordoned ${hangs}: ${String(cordoned.data.evidence)}`
        : `${hangs} not cordoned`,
    });
    ctx.check({
      name: `the corrupting engine ejected within ${BAD_ENGINE_BOUNDS_MS.ejected / 1000} s`,
      ok: ejected !== null,
      figure: { ejectedAfterMs: ejected ? ejected.ts - startedAt : 'never' },
      detail: ejected ? `engine.ejected ${corrupt}: ${String(ejected.data.reason)}` : 'not ejected',
    });
    const registered = await ctx.target.events('engine.registered', startedAt);
    ctx.check({
      name: "the engine naming another's pool refused",
      ok:
        nack?.payload.code === 'BUS_IDENTITY_CONFLICT' &&
        !registered.some((e) => e.engine === 'decode-impostor'),
      figure: { code: nack?.payload.code ?? 'none' },
      detail: 'BUS_IDENTITY_CONFLICT, nothing journaled for it',
    });
    const created = await ctx.target.events('room.created', startedAt);
    const toEmpty = created.filter((e) => e.data.prefillEngine === 'prefill-nopages').length;
    ctx.check({
      name: 'the engine with no pages given no room',
      ok: toEmpty === 0,
      figure: { rooms: toEmpty, of: created.length },
      detail: 'it heartbeated, live and idle, throughout',
    });
    const conflicts = control.book.pageConflicts;
    ctx.check({
      name: 'no page reserved to two live rooms',
      ok: conflicts === 0,
      figure: { conflicts },
      detail: 'pdctl_page_map_conflicts_total',
    });
    const retried = created.filter((e) => e.data.retriedFrom !== undefined).length;
    const blamed = (await ctx.target.events('room.failed', startedAt)).filter(
      (e) => e.data.reason === 'kv_checksum_mismatch',
    ).length;
    ctx.check({
      name: 'the journal says who was blamed and why',
      ok: blamed > 0 && retried > 0 && ejected !== null && cordoned !== null,
      figure: { checksumFailures: blamed, retried },
      detail: `${blamed} rooms failed kv_checksum_mismatch on ${corrupt}, ${retried} tried again elsewhere; engine.ejected and engine.cordoned carry the evidence`,
    });
    const pids = await enginePids(ctx);
    ctx.mark(
      `engines now: ${Object.entries(pids)
        .map(([id, pid]) => `${id} ${pid}`)
        .join(', ')}`,
    );
  },
};

/** A raw engine admitted with a key of its own (the drill started the stack). */
function admitted(ctx: DrillContext, engine: string, role: 'prefill' | 'decode'): RawEngine {
  const local = ctx.local;
  if (!local) throw new Error('needs the stack this drill started');
  const { admission, control } = local.stack;
  return new RawEngine({
    endpoint: control.endpoint,
    engine,
    role,
    keys: admission.issue(engine),
    serverKey: admission.server.publicKey,
  });
}
