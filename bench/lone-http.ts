/**
 * Lone rooms over HTTP against a running `pdctl serve`, shared by `bench:engines -- --hosts` and
 * `-- --lone --tree`: one request at a time with the built-in model, each room's steps and its
 * compute read back from its journal afterwards (so that reading them times nothing).
 */
import { DETERMINISTIC_MODEL_NAME } from '../src/model/deterministic.ts';
import { say } from './args.ts';

export const PROMPT_WORDS = 32;
export const MAX_TOKENS = 16;

export interface Sample {
  /** Request to answer, as this client saw it, minus the compute the engines journaled. */
  addedMs: number[];
  /** Per step of the path (as the journal timed its events): total ms, and rooms counted. */
  steps: Map<string, { ms: number; rooms: number }>;
  failed: number;
}

export const emptySample = (): Sample => ({ addedMs: [], steps: new Map(), failed: 0 });

/**
 * The steps timed from each room's journal: along the path both protocols share, and the decode
 * engine's bootstrap, which protocol 7 takes off the path (it runs beside the prefill).
 */
export const STEPS: ReadonlyArray<[string, string]> = [
  ['room.created', 'room.prefill_started'],
  ['room.prefill_started', 'room.transfer_completed'],
  ['room.transfer_completed', 'room.decode_started'],
  ['room.decode_started', 'room.completed'],
  ['room.created', 'room.bootstrapped'],
];

const words = ['amber', 'north', 'kettle', 'orbit', 'meadow', 'signal', 'harbor', 'lantern'];
const promptOf = (i: number) =>
  Array.from({ length: PROMPT_WORDS }, (_, k) => words[(i * 7 + k * 3) % words.length]).join(' ');

/** `count` lone requests to `base`, one after another; each room's compute read back from its journal. */
export async function loneRooms(
  base: string,
  count: number,
  offset: number,
  into: Sample,
): Promise<void> {
  await readBack(base, await sendLone(base, count, offset, into), into);
}

/** A lone room answered: its id, and the ms from request to answer as the client saw them. */
export interface Answered {
  room: string;
  ms: number;
}

/** `count` lone requests to `base`, one after another (failures counted in `into`). */
export async function sendLone(
  base: string,
  count: number,
  offset: number,
  into: Sample,
): Promise<Answered[]> {
  const rooms: Answered[] = [];
  for (let i = 0; i < count; i++) {
    const t = performance.now();
    const res = await fetch(`${base}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: DETERMINISTIC_MODEL_NAME,
        prompt: promptOf(offset + i),
        max_tokens: MAX_TOKENS,
      }),
    });
    const body = await res.text();
    const ms = performance.now() - t;
    const room = res.headers.get('x-pdctl-room');
    if (res.status === 200 && room) rooms.push({ room, ms });
    else {
      if (into.failed === 0) say(`a request failed: ${res.status} ${body.slice(0, 300)}`);
      into.failed++;
    }
  }
  return rooms;
}

/** The admin token of a serve that has one (PDCTL_ADMIN_TOKEN): its query routes need it. */
export function asOperator(): RequestInit {
  const token = process.env.PDCTL_ADMIN_TOKEN;
  return token ? { headers: { authorization: `Bearer ${token}` } } : {};
}

/** Each answered room's steps and added ms, from its journal, into `into`. */
export async function readBack(base: string, rooms: Answered[], into: Sample): Promise<void> {
  for (const { room, ms } of rooms) {
    const { events } = (await (await fetch(`${base}/v1/rooms/${room}`, asOperator())).json()) as {
      events: Array<{ type: string; ts: number; data: { computeMicros?: number } }>;
    };
    const ts = (type: string) => events.find((e) => e.type === type)?.ts;
    for (const [from, to] of STEPS) {
      const [a, b] = [ts(from), ts(to)];
      if (a === undefined || b === undefined) continue;
      const step = into.steps.get(`${from} → ${to}`) ?? { ms: 0, rooms: 0 };
      step.ms += b - a;
      step.rooms++;
      into.steps.set(`${from} → ${to}`, step);
    }
    const micros = events.reduce(
      (n, e) =>
        n +
        (e.type === 'room.transfer_posted' || e.type === 'room.completed'
          ? (e.data.computeMicros ?? 0)
          : 0),
      0,
    );
    into.addedMs.push(ms - micros / 1000);
  }
}

/** The first-token commit depths the control plane counted (its metric), as counts by depth. */
export async function commitDepths(base: string): Promise<number[]> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const counts: number[] = [];
  for (const m of text.matchAll(/^pdctl_first_token_commits_total\{commits="(\d+)"\} (\d+)/gm))
    counts[Number(m[1])] = Number(m[2]);
  return Array.from(counts, (n) => n ?? 0);
}

/** Mean ms per step over a sample's rooms, rounded to µs. */
export function stepMeans(sample: Sample): Record<string, number> {
  return Object.fromEntries(
    [...sample.steps].map(([k, v]) => [k, Number((v.ms / Math.max(1, v.rooms)).toFixed(3))]),
  );
}

/** The steps table, one column per tree. */
export function stepsTable(
  rows: ReadonlyArray<{ tree: string; stepsMeanMs: Record<string, number> }>,
): string[] {
  return [
    `| step | ${rows.map((r) => r.tree).join(' | ')} |`,
    `|---|${rows.map(() => '--:').join('|')}|`,
    ...STEPS.map(([a, b]) => {
      const k = `${a} → ${b}`;
      return `| ${k} | ${rows.map((r) => r.stepsMeanMs[k] ?? '-').join(' | ')} |`;
    }),
  ];
}
