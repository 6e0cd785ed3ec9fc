/**
 * Drill `abort-cascade`: N streaming HTTP clients, their rooms spread over every stage, all drop
 * their connections in the same instant. Every room must end `aborted` within the target, every
 * page must come back, the journal must verify, and the service must serve the next request.
 */
import type { DrillContext, DrillScenario } from './harness.ts';
import { timingTarget } from './report.ts';

/** Every room must be terminal this long after the drop. */
const TARGET_MS = 2000;

export const abortCascade: DrillScenario = {
  name: 'abort-cascade',
  summary: 'N streaming clients, their rooms spread over every state, drop in the same instant',
  defaultClients: 200,
  // Slow enough that rooms are spread over every stage when the clients drop.
  engineArgs: ['--prefill-us-per-token', '200', '--decode-us-per-token', '2000'],
  run,
};

async function run(ctx: DrillContext): Promise<void> {
  const { target, base, mark, check } = ctx;
  const o = { clients: ctx.clients, targetMs: TARGET_MS };
  const model = target.model;
  const controllers: AbortController[] = [];
  const rooms: string[] = [];
  const streams: Array<Promise<void>> = [];
  mark(`${o.clients} streaming clients connect`);
  for (let i = 0; i < o.clients; i++) {
    const ac = new AbortController();
    controllers.push(ac);
    streams.push(
      fetch(`${base}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model,
          prompt: `drill client ${i} ${'word '.repeat(20 + (i % 200))}`,
          max_tokens: 400,
          stream: true,
        }),
        signal: ac.signal,
      })
        .then(async (r) => {
          const room = r.headers.get('x-pdctl-room');
          if (room) rooms.push(room);
          const reader = (r.body as ReadableStream<Uint8Array>).getReader();
          for (;;) if ((await reader.read()).done) break;
        })
        .catch(() => {}),
    );
    // Spread arrivals so that the rooms are in different stages when the clients drop.
    if (i % 20 === 19) await new Promise((r) => setTimeout(r, 20));
  }
  // Every client has its room (its response headers name it once room.created is committed)
  // before the drop, or 10 s pass; then a moment for the rooms to spread over the stages.
  const admitted = Date.now() + 10_000;
  while (rooms.length < o.clients && Date.now() < admitted)
    await new Promise((r) => setTimeout(r, 10));
  await new Promise((r) => setTimeout(r, 150));
  // The drill's rooms: those its clients were told of, and, on a stack the drill started, every
  // other live room but the canary's (clients whose headers have not arrived yet). A running
  // stack may have clients of its own: their rooms are not the drill's.
  const live = await target.liveRooms();
  if (target.kind === 'local')
    for (const r of live)
      if (!rooms.includes(r.room) && !target.isCanaryRoom(r.room)) rooms.push(r.room);
  const spread: Record<string, number> = {};
  for (const id of rooms) {
    const s = live.find((r) => r.room === id)?.state ?? 'ended';
    spread[s] = (spread[s] ?? 0) + 1;
  }
  mark(
    `rooms by state at the drop: ${Object.entries(spread)
      .map(([k, v]) => `${k} ${v}`)
      .join(', ')}`,
  );
  // A room that ended before the drop (a stack whose model outruns the clients) is not dropped.
  const dropped = rooms.filter((id) => live.some((r) => r.room === id));
  const dropAt = Date.now();
  for (const ac of controllers) ac.abort();
  mark('every client dropped its connection');
  await Promise.all(streams);

  // Every room terminal (aborted) within the target.
  let terminalMs = Number.NaN;
  const deadline = dropAt + o.targetMs * 5;
  while (Date.now() < deadline) {
    const states = await Promise.all(
      rooms.map(async (r) => (await target.timeline(r)).room?.state),
    );
    if (states.every((s) => s === 'aborted' || s === 'completed' || s === 'failed')) {
      terminalMs = Date.now() - dropAt;
      break;
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  mark(
    Number.isNaN(terminalMs)
      ? 'rooms still live'
      : `every room terminal ${terminalMs} ms after the drop`,
  );
  const final = await Promise.all(rooms.map((r) => target.timeline(r)));
  const aborted = final.filter((t) => t.room?.state === 'aborted').length;
  check({
    name: 'every room terminal',
    ok: !Number.isNaN(terminalMs),
    figure: { rooms: rooms.length },
    detail: `${aborted} of ${rooms.length} aborted`,
  });
  check(
    timingTarget('time to all terminal', terminalMs, o.targetMs, 'the drop → the last room ended'),
  );
  // Each room live at the drop ends aborted by its client — or completed, if its last token was
  // out before the abort was asked for (the abort request then finds it terminal, and is refused).
  const ends = dropped.map((id) => final[rooms.indexOf(id)]?.room);
  const byClient = ends.filter(
    (r) => r?.state === 'aborted' && r.reason === 'client_disconnect',
  ).length;
  const finishedFirst = ends.filter(
    (r) => r?.state === 'completed' && r.abortRequestedAt === null,
  ).length;
  check({
    name: 'every room aborted by its client',
    ok: dropped.length > 0 && byClient + finishedFirst === dropped.length,
    figure: { rooms: dropped.length, aborted: byClient, completedFirst: finishedFirst },
    detail:
      dropped.length === 0
        ? 'no room was live at the drop: the engines outran the clients (more --clients, or slower engines)'
        : `${byClient} with reason client_disconnect, ${finishedFirst} completed before the abort was asked for, of ${dropped.length} live at the drop`,
  });

  // Pages: each engine released each room once, and every pool is full again.
  const both = final.filter((t) => t.room && t.room.releasedBy.length === 2).length;
  check({
    name: 'each engine released each room once',
    ok: both === rooms.length,
    figure: { rooms: both },
    detail: `of ${rooms.length}`,
  });
}
