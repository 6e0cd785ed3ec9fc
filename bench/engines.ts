/**
 * End-to-end engine benchmark: rooms per second through the whole stack (control plane, bus,
 * journal, one prefill and one decode engine process, transfer core) and the latency the control
 * plane adds per room (room time minus the model compute the engines measured and journaled), at
 * 1, 16 and 128 concurrent rooms, with near-zero model compute and a heavier setting. Baseline,
 * measured in the same run: the same requests generated in-process by the same model.
 *
 *   npm run bench:engines                  # a table
 *   npm run bench:engines -- --json        # one JSON object with stable keys
 *   npm run bench:engines -- --seconds 5 --durability process
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { startStack } from '../src/app/stack.ts';
import type { Durability } from '../src/journal/store.ts';
import { silentLogger } from '../src/log.ts';
import { DeterministicModel, generateInProcess } from '../src/model/deterministic.ts';
import { asJson, flag, percentile, say } from './args.ts';

const SECONDS = Number(flag('--seconds', '3'));
const DURABILITY = flag('--durability', 'power') as Durability;
const PROMPT_WORDS = 32;
const MAX_TOKENS = 16;
const CONCURRENCY = [1, 16, 128];
const SETTINGS = [
  { name: 'near-zero compute', prefillUs: 0, decodeUs: 0 },
  { name: 'compute 20 µs/prompt token, 250 µs/step', prefillUs: 20, decodeUs: 250 },
];

function promptOf(i: number): string {
  const words = [
    'amber',
    'north',
    'kettle',
    'orbit',
    'willow',
    'granite',
    'velvet',
    'ferry',
    'quartz',
    'lilac',
  ];
  return Array.from({ length: PROMPT_WORDS }, (_, k) => words[(i * 3 + k * 7) % words.length]).join(
    ' ',
  );
}

interface Row {
  setting: string;
  concurrency: number;
  rooms: number;
  roomsPerSec: number;
  inProcessRoomsPerSec: number;
  ratio: number;
  roomMsP50: number;
  roomMsP99: number;
  computeMsP50: number;
  addedMsP50: number;
  addedMsP99: number;
  failed: number;
}

const rows: Row[] = [];
const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-engines-'));
try {
  for (const setting of SETTINGS) {
    // Baseline: the model's own compute for the same requests, in this process, one at a time.
    const model = new DeterministicModel({
      prefillUsPerToken: setting.prefillUs,
      decodeUsPerToken: setting.decodeUs,
    });
    let n = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < 1000) generateInProcess(model, promptOf(n++), MAX_TOKENS);
    const inProcessRoomsPerSec = n / ((performance.now() - t0) / 1000);

    const stack = await startStack({
      journalPath: join(dir, `${rows.length}.db`),
      durability: DURABILITY,
      log: silentLogger,
      version: 'bench',
      engineLogLevel: 'error',
      engineArgs: [
        '--prefill-us-per-token',
        String(setting.prefillUs),
        '--decode-us-per-token',
        String(setting.decodeUs),
        '--pages',
        '16384',
        '--prefill-concurrency',
        '64',
      ],
    });
    try {
      const { control } = stack;
      // Warm up: JIT, sockets, page faults in both pools.
      await Promise.all(
        Array.from(
          { length: 64 },
          (_, i) => control.submit({ prompt: promptOf(i), maxTokens: MAX_TOKENS }).result,
        ),
      );
      for (const concurrency of CONCURRENCY) {
        say(`${setting.name}: ${concurrency} concurrent rooms for ${SECONDS}s …`);
        const times = new Map<string, number>();
        const fromSeq = await control.journal.headSeq();
        let failed = 0;
        const end = performance.now() + SECONDS * 1000;
        const started = performance.now();
        const client = async (c: number) => {
          for (let i = 0; performance.now() < end; i++) {
            const t = performance.now();
            const s = control.submit({ prompt: promptOf(c * 1000 + i), maxTokens: MAX_TOKENS });
            try {
              await s.result;
              times.set(s.room, performance.now() - t);
            } catch {
              failed++;
            }
          }
        };
        await Promise.all(Array.from({ length: concurrency }, (_, c) => client(c)));
        const elapsed = (performance.now() - started) / 1000;
        // What the engines measured and journaled: prefill and decode compute per room.
        const compute = new Map<string, number>();
        const events = [];
        for (let after = fromSeq; ; ) {
          const chunk = await control.journal.readFrom(after, 10_000);
          events.push(...chunk);
          if (chunk.length < 10_000) break;
          after = chunk[chunk.length - 1]?.seq as number;
        }
        for (const ev of events) {
          if (!ev.room || !times.has(ev.room)) continue;
          if (ev.type !== 'room.transfer_posted' && ev.type !== 'room.completed') continue;
          const us = (ev.data as { computeMicros?: number }).computeMicros ?? 0;
          compute.set(ev.room, (compute.get(ev.room) ?? 0) + us / 1000);
        }
        const roomMs = [...times.values()].sort((a, b) => a - b);
        const computeMs = [...times.keys()].map((r) => compute.get(r) ?? 0).sort((a, b) => a - b);
        const added = [...times.entries()]
          .map(([r, ms]) => ms - (compute.get(r) ?? 0))
          .sort((a, b) => a - b);
        const roomsPerSec = times.size / elapsed;
        rows.push({
          setting: setting.name,
          concurrency,
          rooms: times.size,
          roomsPerSec: Math.round(roomsPerSec),
          inProcessRoomsPerSec: Math.round(inProcessRoomsPerSec),
          ratio: Number((roomsPerSec / inProcessRoomsPerSec).toFixed(3)),
          roomMsP50: Number(percentile(roomMs, 50).toFixed(2)),
          roomMsP99: Number(percentile(roomMs, 99).toFixed(2)),
          computeMsP50: Number(percentile(computeMs, 50).toFixed(2)),
          addedMsP50: Number(percentile(added, 50).toFixed(2)),
          addedMsP99: Number(percentile(added, 99).toFixed(2)),
          failed,
        });
      }
    } finally {
      await stack.stop();
    }
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}

if (asJson) {
  process.stdout.write(
    `${JSON.stringify({ bench: 'engines', cores: cpus().length, node: process.version, durability: DURABILITY, seconds: SECONDS, promptWords: PROMPT_WORDS, maxTokens: MAX_TOKENS, rows }, null, 2)}\n`,
  );
} else {
  const out = [
    `pdctl engines benchmark — ${cpus().length} cores, node ${process.version}, durability ${DURABILITY}, ${SECONDS}s per cell,`,
    `1 prefill + 1 decode engine, prompt ${PROMPT_WORDS} tokens, ${MAX_TOKENS} tokens out. Baseline: the same model in-process.`,
    '',
    '| model setting | concurrent | rooms | rooms/s | in-process rooms/s | ratio | room p50 ms | room p99 ms | compute p50 ms | added p50 ms | added p99 ms | failed |',
    '|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|',
    ...rows.map(
      (r) =>
        `| ${r.setting} | ${r.concurrency} | ${r.rooms} | ${r.roomsPerSec} | ${r.inProcessRoomsPerSec} | ${r.ratio} | ${r.roomMsP50} | ${r.roomMsP99} | ${r.computeMsP50} | ${r.addedMsP50} | ${r.addedMsP99} | ${r.failed} |`,
    ),
    '',
    'added = room time seen by the caller minus the model compute the engines journaled for that room',
    '(queueing behind other rooms on this CPU-only model counts as added). Targets: added p99 < 5 ms at 128 concurrent;',
    '≥ 1,000 rooms/s with near-zero compute.',
  ];
  process.stdout.write(`${out.join('\n')}\n`);
}
