/**
 * bench:tenants — `pdctl drill noisy-neighbor`'s phases (src/drills/noisy-neighbor.ts), longer,
 * against a real `pdctl serve` process: one prefill and one decode engine computing on simulated
 * accelerators (the time is the model's, so these 2 cores run only the control plane and HTTP).
 * Capacity first (a batch tenant saturating the fleet), then: an interactive tenant alone (the
 * baseline) and while a batch tenant floods at 4× capacity — its TTFT p99 against solo's (target
 * ≤ 1.25×), none refused; two batch tenants at 10:1 demand, both backlogged — each one's share of
 * the tokens (within 10 % of equal); goodput at 2× overload against capacity (≥ 0.9).
 *
 *   npm run build:ts && npm run bench:tenants                   # 20 s phases: about 2 minutes
 *   npm run bench:tenants -- --phase-seconds 10 --json
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NOISY_ENGINE_ARGS, NOISY_FLEET, noisyNeighbor } from '../src/drills/noisy-neighbor.ts';
import { asJson, checkFlags, flag, say } from './args.ts';
import { startServe, stop } from './serve-process.ts';

const PHASE_S = Number(flag('--phase-seconds', '20'));
checkFlags();

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'pdctl-bench-tenants-'));
  const server = await startServe(dir, [
    '--prefill',
    '1',
    '--decode',
    '1',
    ...NOISY_ENGINE_ARGS,
    '--max-rooms-per-engine',
    String(NOISY_FLEET.roomsPerEngine),
    '--canary-interval-ms',
    '0',
    '--planner',
    'off',
  ]);
  try {
    const f = await noisyNeighbor(server.base, PHASE_S, say);
    if (asJson) process.stdout.write(`${JSON.stringify(f)}\n`);
    else {
      const cols = ['figure', 'value', 'baseline', 'ratio', 'target', 'holds'] as const;
      const cell = (r: (typeof f.rows)[number], c: (typeof cols)[number]) => String(r[c] ?? '-');
      const w = cols.map((c) => Math.max(c.length, ...f.rows.map((r) => cell(r, c).length)));
      const line = (v: string[]) => v.map((x, i) => x.padEnd(w[i] as number)).join('  ');
      process.stdout.write(`${line([...cols])}\n`);
      for (const r of f.rows) process.stdout.write(`${line(cols.map((c) => cell(r, c)))}\n`);
      process.stdout.write(
        `\ncapacity ${f.capacityPerS} answers/s (1 prefill + 1 decode engine, ${NOISY_FLEET.roomsPerEngine} rooms each, ${NOISY_FLEET.maxTokens} tokens at ${NOISY_FLEET.decodeUsPerToken / 1000} ms); the flood: ${f.floodAnswered} answered, ${f.floodRefused} refused; overload: ${f.overloadRefused} refused 429 at their time-to-live\n`,
      );
    }
    process.exitCode = f.rows.every((r) => r.holds) ? 0 : 1;
  } finally {
    await stop(server);
    rmSync(dir, { recursive: true, force: true });
  }
}

void main();
